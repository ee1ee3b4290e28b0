"""Which engine gpuenv talks to: `connect()` picks the adapter (and imports it);
`registry_client()` makes the client of the registry `gpuenv matrix sync` reads. Only the
CLI calls them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuenv.engine.hosts import engine_choice
from gpuenv.errors import EngineError

if TYPE_CHECKING:
    from gpuenv.engine.distribution import DistributionClient
    from gpuenv.engine.protocol import Engine


def connect(host: str | None = None) -> Engine:
    """The engine at `host`, else the one the environment names (`hosts.engine_choice`:
    GPUENV_ENGINE, DOCKER_HOST, CONTAINER_HOST): Podman's adapter for Podman, the
    docker-py adapter for Docker on any transport (unix://, tcp://, ssh://)."""
    kind, address = engine_choice()
    host = host or address
    if kind == "podman" and not host.startswith("unix://"):
        raise EngineError(
            f"gpuenv reaches Podman only on a unix:// socket, not {host}",
            hint="run gpuenv on the Podman host, or forward its socket "
            "(`ssh -L /tmp/podman.sock:/run/user/UID/podman/podman.sock HOST`)",
        )
    # Here, not at the top: docker-py takes ~0.1 s to import, which `gpuenv --version`
    # and `gpuenv resolve` must not pay.
    from gpuenv.engine import dockerpy, podman

    if kind == "podman":
        return podman.PodmanEngine(host)
    return dockerpy.DockerEngine(host)


def registry_client(
    host: str, credentials: dict[str, str] | None = None, *, scheme: str | None = None
) -> DistributionClient:
    """The client of the registry at `host` that `gpuenv matrix sync` reads (the app
    layer picks the host, the scheme and the credentials: `app.matrix.SyncSource`)."""
    # Here, as in `connect`: requests is imported by the commands that read a registry.
    from gpuenv.engine.distribution import DistributionClient

    return DistributionClient(host, credentials, scheme=scheme)
