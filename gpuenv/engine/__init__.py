"""Container engines: the protocols the core sees, and the adapters behind them.

`connect()` is the one place that picks an implementation; only the CLI calls it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuenv.engine.protocol import Engine


def connect(host: str | None = None) -> Engine:
    """The engine at `host`, else the one the environment names (`hosts.engine_choice`:
    GPUENV_ENGINE, DOCKER_HOST, CONTAINER_HOST): Podman's adapter for Podman, the
    Unix-socket client for Docker on unix://, docker-py for tcp:// and ssh://."""
    from gpuenv.engine.hosts import engine_choice

    kind, address = engine_choice()
    host = host or address
    if kind == "podman":
        if not host.startswith("unix://"):
            from gpuenv.errors import EngineError

            raise EngineError(
                f"gpuenv reaches Podman only on a unix:// socket, not {host}",
                hint="run gpuenv on the Podman host, or forward its socket "
                "(`ssh -L /tmp/podman.sock:/run/user/UID/podman/podman.sock HOST`)",
            )
        from gpuenv.engine.podman import PodmanEngine

        return PodmanEngine(host)
    if host.startswith("unix://"):
        from gpuenv.engine.api import UnixSocketEngine

        return UnixSocketEngine(host)
    from gpuenv.engine.dockerpy import DockerEngine

    return DockerEngine(host)
