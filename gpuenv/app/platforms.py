"""Whether the engine runs an image's platform: an image built for another one fails with
"exec format error", so a build or a run refuses it first."""

from __future__ import annotations

from collections.abc import Sequence

from gpuenv.common.platforms import platform_of_machine, this_platform
from gpuenv.engine.protocol import Engine
from gpuenv.errors import GpuenvError, ResolutionError


def engine_platform(engine: Engine) -> str | None:
    """The platform the engine runs containers on: this machine's for a local socket,
    else what the engine says (one request)."""
    if engine.endpoint.startswith("unix://"):
        return this_platform()
    try:
        return platform_of_machine(str(engine.info().get("Architecture") or ""))
    except GpuenvError:
        return None


def check_platform(image: str, platforms: Sequence[str], engine: Engine) -> None:
    """Refuse an image that is not built for the engine's platform (it would fail with
    "exec format error"); nothing when either is unknown."""
    if not platforms:
        return
    here = engine_platform(engine)
    if here is None or here in platforms:
        return

    listed = ", ".join(platforms)
    raise ResolutionError(
        f"{image} is built for {listed}, and this engine runs {here} containers",
        [f"an image for {listed} fails on {here} with 'exec format error'"],
        hint="resolve for this machine with `gpuenv lock --upgrade` (it picks an image built "
        f"for {here}), or run where the image runs",
    )
