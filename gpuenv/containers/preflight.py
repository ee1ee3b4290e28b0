"""The run's preflight: can this host's driver and GPUs run the locked image? The locked
image is judged as the resolver judges a matrix row, from what the lock recorded."""

from __future__ import annotations

from gpuenv.common.versions import recorded_capability, recorded_driver
from gpuenv.errors import ResolutionError
from gpuenv.host.machine import Host
from gpuenv.lock.locked import Locked
from gpuenv.matrix.model import ImageRow, Matrix
from gpuenv.project.spec import default_spec
from gpuenv.reservations.gpus import Grant
from gpuenv.resolution.resolve import MINOR, classify_gpus, evaluate


def preflight(lock: Locked, host: Host, grant: Grant, matrix: Matrix) -> list[str]:
    """Refuse (ResolutionError) when this host cannot run the locked image; warnings else."""
    if host.driver is None or grant.mode == "none":
        return []
    resolved, requires = lock.resolved, lock.requires
    repository, _, tag = lock.image.rpartition(":")
    row = ImageRow(
        framework=str(resolved.get("framework") or "none"),
        family="ngc",
        repository=repository,
        tag=tag,
        release=resolved.get("release"),
        framework_version=resolved.get("framework_version"),
        cuda=resolved.get("cuda"),
        cudnn=resolved.get("cudnn"),
        python=resolved.get("python"),
        ubuntu=resolved.get("ubuntu"),
        min_driver=recorded_driver(requires.get("min_driver")),
        forward_compat=tuple(
            d for b in requires.get("forward_compat") or () if (d := recorded_driver(b))
        ),
        min_compute_capability=recorded_capability(requires.get("min_compute_capability")),
        evidence=str(resolved.get("evidence") or "unverified"),
        unverified=tuple(resolved.get("unverified") or ()),
        note="",
        source="gpuenv.lock",
    )
    gpus = classify_gpus(host, matrix)
    if grant.mode == "devices":
        gpus = tuple(
            g
            for g in gpus
            if str(g.gpu.index) in grant.devices
            or g.gpu.uuid in grant.devices
            or any(m.uuid in grant.devices for m in g.gpu.mig_devices)  # an instance's GPU
        )
    (candidate,) = evaluate(default_spec(".", row.framework), matrix, host, gpus, [row])
    if candidate.rejections:
        raise ResolutionError(
            f"this host cannot run the locked image {lock.image}: {host.describe()}",
            [r.reason for r in candidate.rejections],
            hint=(
                f"upgrade the driver to ≥ {candidate.min_driver}, or "
                if any(r.check == "driver" for r in candidate.rejections) and candidate.min_driver
                else ""
            )
            + "re-resolve for this host with `gpuenv lock --upgrade` (it picks an image built "
            "for it); --force tries anyway",
        )
    if candidate.driver_route and candidate.driver_route.startswith("CUDA forward"):
        return [f"runs through {candidate.driver_route}"]
    if candidate.mode == MINOR:
        return [f"runs on {candidate.driver_route}"]
    return []
