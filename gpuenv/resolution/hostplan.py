"""The host a command plans for: this machine (or GPUENV_HOST_FILE's), or one described
by `--driver`, `--gpu MODEL` and `--platform`, its GPUs looked up in the matrix."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpuenv.common.platforms import PLATFORMS
from gpuenv.common.versions import DriverVersion, InvalidDriverVersion
from gpuenv.errors import UsageError
from gpuenv.host.detect import detect_host
from gpuenv.host.machine import Gpu, Host
from gpuenv.matrix.model import Matrix


def describe_host(driver: str | None, models: Sequence[str], matrix: Matrix) -> Host:
    """A planned host from `--driver` and `--gpu MODEL` flags, GPUs looked up in the matrix.
    A bad flag value is a UsageError (exit 2), whatever the flag."""
    parsed = None
    if driver is not None:
        try:
            parsed = DriverVersion.parse(driver)
        except InvalidDriverVersion as exc:
            raise UsageError(
                f"--driver: {exc}", hint="give the driver as `nvidia-smi` prints it"
            ) from None
    gpus = []
    for index, name in enumerate(models):
        model = matrix.find_gpu(name)
        if model is None:
            names = [m.name for m in matrix.gpus]
            close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise UsageError(
                f"--gpu {name!r}: not a GPU model gpuenv knows.{hint} "
                "`gpuenv matrix gpus` lists them."
            )
        gpus.append(Gpu(index=index, name=model.name, compute_capability=model.compute_capability))
    if gpus and driver is None:
        raise UsageError("--gpu needs --driver too: which driver will that host run?")
    return Host(parsed, tuple(gpus), "flags")


@dataclass(frozen=True)
class HostPlan:
    """The host to plan for: --driver/--gpu when given, else this machine."""

    driver: str | None = None
    gpu_models: tuple[str, ...] = ()
    platform: str | None = None  # --platform; a described host's is unknown without it

    @property
    def given(self) -> bool:
        return self.driver is not None or bool(self.gpu_models) or self.platform is not None

    def host(self, matrix: Matrix) -> Host:
        if self.driver is not None or self.gpu_models:
            host = describe_host(self.driver, self.gpu_models, matrix)
        else:
            host = detect_host()
        if self.platform is not None:
            if self.platform not in PLATFORMS:
                raise UsageError(
                    f"--platform {self.platform!r} is not one of {', '.join(PLATFORMS)}"
                )
            host = replace(host, platform=self.platform)
        return host
