"""One writer at a time for a project file: an exclusive flock on a lock-file beside it.

`gpuenv lock` reads gpuenv.lock, resolves and writes it back; two of them at once would
each write a lock made from what the other was replacing. The flock is held on
``.NAME.lock`` next to the file (never on the file itself, which an atomic write
replaces), and the holder writes who it is there, so a waiter that gives up can name it.
The kernel releases a flock when its process ends, however it ends.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import getpass
import json
import os
import sys
import time
from collections.abc import Iterator

from gpuenv.common import nesting
from gpuenv.errors import LockHeld, file_error

TIMEOUT_ENV = "GPUENV_LOCK_TIMEOUT"
DEFAULT_TIMEOUT = 10.0
_POLL = 0.05


def wait_for_lock(fd: int, timeout: float, *, posix: bool = False, poll: float = _POLL) -> bool:
    """Take an exclusive lock on `fd`, waiting at most `timeout` seconds: whether it was
    taken (the caller says who holds it, and what to do). A flock by default; `posix`: a
    POSIX record lock (lockf), which `F_GETLK` can name the holder of. Both are dropped by
    the kernel when their holder ends, however it ends. Other failures are raised."""
    take = fcntl.lockf if posix else fcntl.flock
    deadline = time.monotonic() + timeout
    while True:
        try:
            take(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll)


def lock_file_of(path: str) -> str:
    """``dir/.NAME.lock`` for ``dir/NAME``."""
    folder, name = os.path.split(os.path.abspath(path))
    return os.path.join(folder, f".{name}.lock")


def _timeout() -> float:
    try:
        return max(0.0, float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT)))
    except ValueError:
        return DEFAULT_TIMEOUT


def _open(lock_path: str) -> tuple[int, bool] | None:
    """A descriptor of the lock-file and whether it is writable; None in a folder
    nobody here can create files in (then nothing here can write the file either)."""
    try:
        return os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o664), True
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise file_error(exc, "write", lock_path) from None
    try:  # another user's lock-file in a shared folder: flock needs no write access
        return os.open(lock_path, os.O_RDONLY | os.O_CLOEXEC), False
    except OSError:
        return None


def _holder(fd: int) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        data = nesting.loads(json.loads, os.read(fd, 4096) or b"{}")
        pid = int(data["pid"])
        since = time.strftime("%H:%M:%S", time.localtime(float(data["since"])))
        return f"pid {pid} ({data['user']}, `{data['command']}`), since {since}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that did not say who it is"


def _identity() -> bytes:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid {os.getuid()}"
    command = "gpuenv " + " ".join(sys.argv[1:])
    return json.dumps(
        {"pid": os.getpid(), "user": user, "command": command[:200], "since": time.time()}
    ).encode()


@contextlib.contextmanager
def exclusive(path: str, timeout: float | None = None) -> Iterator[None]:
    """Hold the lock for writing `path`; LockHeld (exit 9), naming the holder, when
    another process keeps it past `timeout` seconds (GPUENV_LOCK_TIMEOUT, default 10)."""
    lock_path = lock_file_of(path)
    opened = _open(lock_path)
    if opened is None:
        yield  # a read-only or foreign folder: the write itself will say so, with the path
        return
    fd, writable = opened
    try:
        if not wait_for_lock(fd, _timeout() if timeout is None else timeout):
            holder = _holder(fd)
            pid = holder.split()[1] if holder.startswith("pid ") else None
            stop = f" (`kill {pid}`)" if pid else ""
            raise LockHeld(
                f"{os.path.basename(path)} is being changed by another gpuenv process: {holder}",
                hint=f"wait for it to finish and retry, or stop that process{stop}; "
                f"set {TIMEOUT_ENV} to wait longer",
            )
        if writable:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.pwrite(fd, _identity(), 0)
        try:
            yield
        finally:
            if writable:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, 0)
    finally:
        os.close(fd)
