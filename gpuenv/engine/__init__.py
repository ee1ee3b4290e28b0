"""Container engines: the protocols the core sees, and the adapters behind them.

`connect()` is the one place that picks an implementation; only the CLI calls it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuenv.engine.protocol import Engine


def connect(host: str | None = None) -> Engine:
    """The engine at `host` (DOCKER_HOST, else the default socket): the Unix-socket
    client for unix://, docker-py for tcp:// and ssh://."""
    from gpuenv.engine.hosts import docker_host

    host = host or docker_host()
    if host.startswith("unix://"):
        from gpuenv.engine.api import UnixSocketEngine

        return UnixSocketEngine(host)
    from gpuenv.engine.dockerpy import DockerEngine

    return DockerEngine(host)
