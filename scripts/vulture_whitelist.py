"""Names vulture cannot see used (read by `make test`'s dead-code check).

Each is used, but not by a call vulture can follow: attributes read by the stdlib or
a library, state kept for views and tests, fields of JSON-facing records.
"""

# string.Template subclasses: the class attribute is read by string.Template.
delimiter  # noqa: B018
# tarfile.TarInfo fields set before addfile().
mtime  # noqa: B018
linkname  # noqa: B018
# Build progress state, read by the views and pinned by tests/unit/test_progress.py.
step_number  # noqa: B018
step_count  # noqa: B018
image_id  # noqa: B018
# Records whose fields are data for --json and for the next callers (issue 12).
subject  # noqa: B018
interrupted  # noqa: B018
baked  # noqa: B018
# A typing-only import (TYPE_CHECKING) for the cache's dataclass rebuild.
DataclassInstance  # noqa: B018
# PEP 562 module attribute hook (ui.err / ui.out, made on first use).
__getattr__  # noqa: B018
# rich calls Console.on_broken_pipe when stdout closes (overridden in gpuenv.cli.ui).
on_broken_pipe  # noqa: B018
# NVML readings kept on Gpu for --json, the exporter and the next issue (MIG).
gpu_instance  # noqa: B018
compute_instance  # noqa: B018
shutdown_temperature_c  # noqa: B018
mig_mode  # noqa: B018
mig_devices  # noqa: B018
# A claim's record on disk (asdict): who made it, for people reading the state folder.
pid_start  # noqa: B018
# The Kubernetes versions the docs claim, each validated by tests/unit/test_manifests.py.
KUBERNETES_VERSIONS  # noqa: B018
