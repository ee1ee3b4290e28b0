"""MIG instances' CDI device names.

nvidia-ctk names a MIG device ``MIG-<uuid>`` (``--device-name-strategy=uuid``) or
``<gpu index>:<MIG index>`` (``index``): nvidia-container-toolkit pkg/nvcdi/namer.go,
``GetMigDeviceName``. The legacy request takes the MIG UUID as a device id, as
NVIDIA_VISIBLE_DEVICES does.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuenv.host.machine import Gpu


def cdi_mig_names(gpu: Gpu, devices: Mapping[str, str]) -> dict[str, str]:
    """The CDI device of each of the GPU's instances that `devices` (spec name -> qualified
    name) names, by MIG UUID or by ``<gpu index>:<MIG index>``.

    >>> from gpuenv.host.machine import MigDevice
    >>> gpu = Gpu(1, "A100", mig_devices=(MigDevice("MIG-a", index=0), MigDevice("MIG-b", index=1)))
    >>> cdi_mig_names(gpu, {"MIG-a": "nvidia.com/gpu=MIG-a", "1:1": "nvidia.com/gpu=1:1"})
    {'MIG-a': 'nvidia.com/gpu=MIG-a', 'MIG-b': 'nvidia.com/gpu=1:1'}
    """
    names = {}
    for mig in gpu.mig_devices:
        by_index = f"{gpu.index}:{mig.index}"
        if mig.uuid in devices:
            names[mig.uuid] = devices[mig.uuid]
        elif mig.index is not None and by_index in devices:
            names[mig.uuid] = devices[by_index]
    return names
