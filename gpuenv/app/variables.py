"""The spec's `env:` for a file that runs the image elsewhere (a Slurm job, a Kubernetes
Job, a Compose service): `$VAR` references expanded against the image's environment, as
`gpuenv run` expands them, so every place the image runs sees the same values."""

from __future__ import annotations

from collections.abc import Callable

from gpuenv.engine.protocol import Engine
from gpuenv.errors import EngineError, UsageError
from gpuenv.project.spec import Spec
from gpuenv.project.variables import image_environment, refers, spec_with_image_env


def expanded_spec(spec: Spec, image: str, engine: Callable[[], Engine]) -> Spec:
    """`spec` with its env values expanded against `image`'s environment. The engine is
    asked only when a value refers to a variable; UsageError, with the fix, when it
    cannot say (not reachable, or it does not have the image)."""
    if not refers(spec.env):
        return spec
    names = ", ".join(key for key, value in spec.env if "$" in value)
    try:
        config = engine().image_config(image)
    except EngineError as exc:
        config, reason = None, f"the engine cannot be asked ({exc.message})"
    else:
        reason = "this engine does not have it"
    if config is None:
        first = (
            f"pull it (`docker pull {image}`) and export again"
            if reason == "this engine does not have it"
            else "start the engine (or set DOCKER_HOST) and export again"
        )
        raise UsageError(
            f"gpuenv.yaml's env ({names}) refers to the image's variables, which gpuenv "
            f"reads from {image}: {reason}",
            hint=f"{first}, or write the values out in full in gpuenv.yaml",
        )
    return spec_with_image_env(spec, image_environment(config))
