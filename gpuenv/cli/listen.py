"""--listen HOST:PORT for the commands that serve (exporter, dashboard): parsing it, and
what to do when it cannot be bound."""

from __future__ import annotations

import errno

from gpuenv.errors import UsageError


def parse_listen(text: str, default: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets) -> (host, port); a usage error otherwise.

    >>> parse_listen("[::1]:9478", "127.0.0.1:9478")
    ('::1', 9478)
    """
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--listen {text!r}: expected HOST:PORT, e.g. {default} or 0.0.0.0:PORT")
    return host, int(port)


def bind_hint(exc: OSError, port: int, default_port: int) -> str:
    """What to do when the address cannot be bound, by why."""
    if exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
        return (
            f"that address is not one of this host's: give one of its addresses, or "
            f"0.0.0.0:{port} for every interface"
        )
    if exc.errno == errno.EACCES:
        return f"ports below 1024 need root: pick a port above 1024 ({default_port} is the default)"
    if exc.errno == errno.EADDRINUSE:
        return "something listens there already: pick another port, or stop it"
    return "pick another address with --listen HOST:PORT"
