"""`gpuenv resolve`: the image for the spec on this host, or a described one; nothing is
written (`gpuenv lock` pins it)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpuenv.app.lock import differs_from_lock, resolve_project
from gpuenv.app.own_base import BaseReader
from gpuenv.errors import ResolutionError
from gpuenv.host.machine import Host
from gpuenv.matrix.load import load_matrix
from gpuenv.project.overrides import Overrides, checked_overrides, spec_for
from gpuenv.resolution.hostplan import HostPlan
from gpuenv.resolution.verdicts import Resolution


@dataclass(frozen=True)
class Answer:
    """What `gpuenv resolve` answers: the resolution (with a warning where gpuenv.lock
    pins another image), the host it was resolved for, and the matrix's version."""

    resolution: Resolution
    host: Host
    matrix_version: str


def resolve_spec(
    directory: str,
    flags: Overrides,
    plan: HostPlan,
    *,
    strict_driver: bool = False,
    newest: bool = False,
    read_base: BaseReader | None = None,
) -> Answer:
    """Resolve the project's spec (gpuenv.yaml where present, the flags over it) for the
    host `plan` describes. A ResolutionError carries the host it was resolved for
    (`host`), for `--explain` to show the candidates against."""
    spec = spec_for(directory, checked_overrides(*flags))
    if strict_driver:
        spec = spec.with_overrides(strict_driver=True)
    matrix = load_matrix()
    host = plan.host(matrix)
    try:
        resolution = resolve_project(spec, matrix, host, newest=newest, read_base=read_base)
    except ResolutionError as exc:
        exc.host = host
        raise
    differs = differs_from_lock(directory, resolution.row.image)
    if differs:
        resolution = replace(resolution, warnings=(*resolution.warnings, differs))
    return Answer(resolution, host, matrix.version)


def gpu_model_names() -> list[str]:
    """The GPU models the matrix knows, for completing `--gpu`."""
    return [model.name for model in load_matrix().gpus]
