"""Small file helpers shared by the spec, lock and later image code."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import tarfile
import tempfile

from gpuenv.errors import file_error


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
