"""What /proc says about a process: when it started (so a reused pid is not mistaken for
the process it replaced), which container it runs in, and whose it is."""

from __future__ import annotations

import re

_CONTAINER_ID = re.compile(r"([0-9a-f]{64})")


def process_start(pid: int) -> str:
    """The kernel's start time of a process, or '' when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def container_of(pid: int) -> str | None:
    """The Docker container a host process runs in, from its cgroup path."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="ascii", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    match = _CONTAINER_ID.search(text)
    return match.group(1) if match else None


def process_owner(pid: int) -> str:
    """The user name (or uid) a process runs as; '?' when it is gone."""
    import pwd

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
