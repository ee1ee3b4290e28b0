"""Small file helpers shared by the spec, lock and later image code."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import stat
import tarfile
import tempfile

from gpuenv.errors import file_error

# The most gpuenv reads of a file a person writes (a spec, a dependency file, a host
# file): far above any real one, far below what would fill memory.
MAX_TEXT_BYTES = 16 << 20

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def kind_of(path: str) -> str | None:
    """What `path` is when it is there but no regular file (``a named pipe``, ``a
    folder``, links followed); None for a file, or nothing there."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return next((name for test, name in _KINDS if test(mode)), None)


class NotAFile(Exception):
    """A path gpuenv will not read as a file; the message says why, after the path."""


def read_capped(path: str, limit: int = MAX_TEXT_BYTES) -> bytes:
    """A regular file's bytes. Never waits (a named pipe opens without blocking and is
    refused) and never reads without end (`/dev/zero`, a file over `limit`): NotAFile.
    OSError as `open` raises it (missing, permission)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), None)
            raise NotAFile(f"is {kind}, not a file" if kind else "is not a regular file")
        data = read_up_to(fd, limit)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise NotAFile(f"is larger than {limit >> 20} MiB: not a file a person writes")
    return data


def read_up_to(fd: int, limit: int) -> bytes:
    """What the open file `fd` holds, read until its end or one byte past `limit` (so a
    caller sees that it is larger): never more, whatever the file claims to be."""
    chunks, size = [], 0
    while size <= limit:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def atomic_write(path: str, text: str, mode: int = 0o644) -> None:
    """Write `text` so that readers see the old file or the new one, never a mix.

    Temporary file in the same folder, fsync, rename; an existing file keeps its mode.
    A folder that cannot be written, or a disk that fills up half-way, leaves the old file
    as it was and raises FileAccessError (exit 8) naming `path`.
    """
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, temp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
    except OSError as exc:
        raise file_error(exc, "write", path, folder=True) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, os.stat(path).st_mode & 0o777 if os.path.exists(path) else mode)
        os.replace(temp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        if isinstance(exc, OSError):
            raise file_error(exc, "write", path) from None
        raise


def file_hash(path: str) -> str:
    """``sha256:<hex>`` of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 16), b""):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def file_from_archive(data: bytes | None) -> str:
    """The first file of a tar (GET /archive answers with one), as text; '' if none."""
    if not data:
        return ""

    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        for member in archive.getmembers():
            if member.isfile():
                extracted = archive.extractfile(member)
                return extracted.read().decode(errors="replace") if extracted else ""
    return ""
