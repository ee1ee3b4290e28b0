"""The usage records' files, opened so that no other local user can forge, redirect or
block them (the threat and the rules are those of `statedir`).

`usage/` and `usage/ended/` are opened relative to the state folder's descriptor with
O_NOFOLLOW and checked with fstat: owned by root or the state folder's owner, sticky when
others may write in them. Only that owner (or root) creates them: in the shared,
root-owned folder that is root or the admin. Each user's `<uid>.jsonl` is owned by that
uid, mode 0600, made with O_EXCL; every file is opened with O_NOFOLLOW|O_NONBLOCK (a
FIFO never blocks a reader), must be a regular file with one link, and is read up to a
size cap.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
from collections.abc import Iterator, Mapping
from typing import Any

from gpuenv.common import nesting
from gpuenv.common.filelock import wait_for_lock
from gpuenv.common.files import read_up_to
from gpuenv.errors import StateUnsafe, UsageError
from gpuenv.reservations.statedir import owner_name

DIR_MODE = 0o1777
FILE_MODE = 0o600
MAX_FILE = 64 * 1024 * 1024  # a user's records: far more than years of runs
MAX_MARKER = 4096
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def admin_hint(where: str) -> str:
    return (
        f"an admin creates it once: `sudo install -d -m 1777 -o root {where}` (and `{where}/ended`)"
    )


def open_dir(parent: int, name: str, where: str, owner: int, *, create: bool) -> int | None:
    """A usage folder `name` in the folder `parent` (owned by `owner`), checked; None when
    it is missing and not `create`d. Made (mode 1777) only by `owner` or root."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            return None
        if os.getuid() not in (0, owner):
            who = "root" if owner == 0 else f"{owner_name(owner)} or root"
            raise UsageError(
                f"{where} does not exist, and only {who} may create it",
                hint=admin_hint(where),
            ) from None
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=parent)
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        info = os.fstat(fd)
        if info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) == 0o700:
            os.fchmod(fd, DIR_MODE)  # the folder we just made, through its descriptor
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise StateUnsafe(
                f"{where} is a symbolic link or not a folder: gpuenv never follows one",
                hint=f"its owner or root removes it; {admin_hint(where)}",
            ) from None
        raise UsageError(f"cannot open the usage folder {where}: {exc.strerror}") from None
    info = os.fstat(fd)
    problem = ""
    if info.st_uid not in (0, owner):
        problem = f"belongs to {owner_name(info.st_uid)} (uid {info.st_uid})"
    elif info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
        problem = f"has mode {stat.S_IMODE(info.st_mode):o} (others can delete records)"
    if problem:
        os.close(fd)
        raise StateUnsafe(
            f"the usage folder {where} {problem}: its records cannot be trusted",
            hint=f"root removes it; {admin_hint(where)}",
        )
    return fd


@contextlib.contextmanager
def _locked(fd: int, where: str, timeout: float) -> Iterator[None]:
    if not wait_for_lock(fd, timeout):
        raise UsageError(
            f"{where} stayed locked by another gpuenv for {timeout:g}s: usage not recorded"
        )
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def _open_for_append(directory: int, name: str, owner: int, where: str) -> int:
    flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    created = False
    try:
        try:
            fd = os.open(name, flags | os.O_CREAT | os.O_EXCL, FILE_MODE, dir_fd=directory)
            created = True
        except FileExistsError:
            fd = os.open(name, flags, dir_fd=directory)
    except OSError as exc:
        raise UsageError(f"cannot write usage records to {where}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if created and info.st_uid != owner:
            os.fchown(fd, owner, -1)  # root makes a user's file for them
            info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or info.st_uid != owner:
            raise UsageError(
                f"{where} is not uid {owner}'s usage file (owned by uid {info.st_uid}, "
                "or not a plain file): not writing to it",
                hint="its owner or root removes it; gpuenv makes it again",
            )
        if stat.S_IMODE(info.st_mode) != FILE_MODE:
            os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def append(
    directory: int, name: str, record: Mapping[str, Any], owner: int, where: str, timeout: float
) -> None:
    """One record as one line, fsync'd, in `owner`'s file `name` (root makes it for them)."""
    fd = _open_for_append(directory, name, owner, where)
    try:
        with _locked(fd, where, timeout):
            os.write(fd, (json.dumps(record, sort_keys=True) + "\n").encode())
            os.fsync(fd)
    finally:
        os.close(fd)


def read_owned(directory: int, name: str, limit: int) -> tuple[int, bytes] | None:
    """A plain file's owner and content (None: missing, a link, a FIFO, too big)."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=directory)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        data = read_up_to(fd, limit)
        return (info.st_uid, data) if len(data) <= limit else None
    except OSError:
        return None
    finally:
        os.close(fd)


def records(data: bytes) -> Iterator[dict[str, Any]]:
    """The JSON objects of a records file, one a line; a line torn by a crash is skipped."""
    for line in data.decode(errors="replace").splitlines():
        try:
            record = nesting.loads(json.loads, line)
        except ValueError:
            continue
        if isinstance(record, dict):
            yield record


def owner_names(directory: int, uid: int) -> Iterator[tuple[int, str]]:
    """(uid, name) of each `<uid>.jsonl` that `uid` may read: root all, a user their own
    (the file's owner is checked where it is opened)."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return
    for name in names:
        stem, dot, suffix = name.partition(".")
        if not (dot and suffix == "jsonl" and stem.isdigit() and stem.isascii()):
            continue
        owner = int(stem)
        if uid in (0, owner) and str(owner) == stem:
            yield owner, name


def owner_files(directory: int, uid: int) -> Iterator[tuple[int, bytes]]:
    """(uid, content) of each `<uid>.jsonl` owned by that uid that `uid` may read: root
    all, a user their own. Any other name, owner or kind of file is ignored."""
    for owner, name in owner_names(directory, uid):
        found = read_owned(directory, name, MAX_FILE)
        if found is not None and found[0] == owner:
            yield owner, found[1]
