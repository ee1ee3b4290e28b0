"""Published ports at run time: a host port already taken is refused before anything
starts (a run's container is never created for it), and what the engine chose for a
free port is read back to say the URL."""

from __future__ import annotations

import contextlib
import errno
import socket
from collections.abc import Mapping, Sequence

from gpuenv.engine.protocol import ContainerEngine
from gpuenv.errors import GpuenvError, StartError
from gpuenv.project.ports import Port, published

# What engines say when the host port is taken after all (a race with the check).
TAKEN = ("port is already allocated", "address already in use", "bind: address already")


def port_taken(message: str) -> bool:
    """Whether an engine's refusal to start a container is a host port in use."""
    lowered = message.lower()
    return any(text in lowered for text in TAKEN)


def taken_error(port: Port, why: str) -> StartError:
    return StartError(
        f"cannot publish port {port.container} on {port.address}:{port.host}: {why}",
        hint=f"choose another host port (-p {port.address}:PORT:{port.container}), or "
        f"0 for a free one (-p 0:{port.container}); `gpuenv ps` shows the ports of runs",
    )


def check_free(ports: Sequence[Port]) -> None:
    """StartError (exit 14) for the first port whose host port something already
    listens on (another user's run, or any program): found by binding it, as the engine
    would, and letting it go at once."""
    for port in ports:
        if not port.host:
            continue
        family = socket.AF_INET6 if ":" in port.address else socket.AF_INET
        kind = socket.SOCK_STREAM if port.protocol == "tcp" else socket.SOCK_DGRAM
        with contextlib.closing(socket.socket(family, kind)) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((port.address, port.host))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise taken_error(port, "something on this host already uses it") from None
                if exc.errno == errno.EACCES:
                    raise StartError(
                        f"cannot publish port {port.container} on {port.address}:"
                        f"{port.host}: ports below 1024 are root's",
                        hint=f"use a port from 1024 up (-p {port.address}:8{port.container:03d}"
                        f":{port.container}), or 0 for a free one",
                    ) from None
                if exc.errno == errno.EADDRNOTAVAIL:
                    raise StartError(
                        f"cannot publish port {port.container} on {port.address}: this host "
                        "has no such address",
                        hint="name an address of this host, or leave it out (127.0.0.1)",
                    ) from None
                raise


def urls(engine: ContainerEngine, container: str) -> list[Port]:
    """The ports the container publishes, with the host ports the engine chose."""
    try:
        settings = engine.inspect(container).get("NetworkSettings") or {}
    except GpuenvError:
        return []
    return published(settings.get("Ports"))


def ssh_tunnel(port: Port, environ: Mapping[str, str]) -> str | None:
    """`ssh -L 8888:127.0.0.1:49153 alice@10.0.0.5` where gpuenv runs in an SSH session
    (SSH_CONNECTION names the server's address) and the port is on loopback; else None.

    >>> ssh_tunnel(Port(8888, 49153), {"SSH_CONNECTION": "10.0.0.9 5022 10.0.0.5 22",
    ...                                 "USER": "alice"})
    'ssh -L 49153:127.0.0.1:49153 alice@10.0.0.5'
    >>> ssh_tunnel(Port(8888, 49153), {}) is None
    True
    """
    fields = environ.get("SSH_CONNECTION", "").split()
    if len(fields) != 4 or port.protocol != "tcp" or port.address not in ("127.0.0.1", "::1"):
        return None
    server = f"[{fields[2]}]" if ":" in fields[2] else fields[2]
    user = environ.get("USER", "")
    target = f"{user}@{server}" if user else server
    return f"ssh -L {port.host}:{port.address}:{port.host} {target}"
