"""What /proc says about a process: when it started (so a reused pid is not mistaken for
the process it replaced), which container it runs in, and whose it is."""

from __future__ import annotations

import errno
import os
import pwd
import re

# Patterns as text: re compiles (and keeps) each on its first use, not at import.
_CONTAINER_ID = r"([0-9a-f]{64})"


def process_start(pid: int) -> str:
    """The kernel's start time of a process, or '' when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def process_gone(pid: int, start: str) -> bool:
    """Whether the process `pid` that started at `start` is certainly gone: no such pid,
    or a pid reused by a process that started later. Where /proc is private (hardened
    hosts) a pid that exists counts as alive: it cannot be told from its reuse.

    >>> import os
    >>> process_gone(os.getpid(), process_start(os.getpid()) or "?")
    False
    """
    if pid <= 0:
        return True  # no process; and kill(0 or -1) would mean a group, or everyone
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the pid exists
    except OSError as exc:
        if exc.errno == errno.ESRCH:
            return True
    now = process_start(pid)
    return bool(now) and bool(start) and now != start


def container_of(pid: int) -> str | None:
    """The Docker container a host process runs in, from its cgroup path."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="ascii", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    match = re.search(_CONTAINER_ID, text)
    return match.group(1) if match else None


def process_owner(pid: int) -> str:
    """The user name (or uid) a process runs as; '?' when it is gone."""
    uid = process_uid(pid)
    if uid is None:
        return "?"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def process_uid(pid: int) -> int | None:
    """The real uid a process runs as; None when it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _proc_address(host: str, port: int) -> str | None:
    """An address as /proc/net/tcp{,6} writes it: the address in host-order 32-bit words,
    then the port, in hex.

    >>> _proc_address("127.0.0.1", 8478)
    '0100007F:211E'
    """
    import socket
    import struct

    try:
        if ":" in host:
            packed = socket.inet_pton(socket.AF_INET6, host)
            words = struct.unpack("<4I", packed)
            return "".join(f"{w:08X}" for w in words) + f":{port:04X}"
        (word,) = struct.unpack("<I", socket.inet_aton(host))
    except (OSError, ValueError):
        return None
    return f"{word:08X}:{port:04X}"


def loopback_peer(client: tuple[str, int], server: tuple[str, int]) -> int | None:
    """Whose process holds the client end of a local TCP connection (the uid /proc/net
    lists for the socket from `client` to `server`); None when it cannot be told."""
    local, remote = _proc_address(*client[:2]), _proc_address(*server[:2])
    if local is None or remote is None:
        return None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii", errors="replace") as handle:
                lines = handle.read(4 << 20).splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 7 and fields[1] == local and fields[2] == remote:
                return int(fields[7]) if fields[7].isdigit() else None
    return None
