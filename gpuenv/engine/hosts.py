"""Where the engine is (DOCKER_HOST) and the one translation of "cannot talk to it"."""

from __future__ import annotations

import os
from collections.abc import Mapping

from gpuenv.errors import EngineError, GpuenvError

DEFAULT_HOST = "unix:///var/run/docker.sock"


def docker_host(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get("DOCKER_HOST") or DEFAULT_HOST


def not_running(host: str) -> EngineError:
    return EngineError(
        f"cannot reach the Docker engine at {host}: is it running?",
        hint="start it (`sudo systemctl start docker`, or `sudo dockerd &`), "
        "or point DOCKER_HOST at a running engine",
    )


def engine_error(exc: BaseException, host: str) -> GpuenvError:
    """The one translation of "cannot talk to the engine" into what to do next."""
    text = str(exc)
    if isinstance(exc, PermissionError) or "Permission denied" in text:
        where = host.removeprefix("unix://")
        return EngineError(
            f"permission denied on the Docker socket {where}",
            hint="add yourself to the docker group (`sudo usermod -aG docker $USER`, then log "
            "in again), or use rootless Docker",
        )
    return not_running(host)
