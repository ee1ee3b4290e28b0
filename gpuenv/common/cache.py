"""A per-user cache of validated data, so a command does not redo work whose inputs
have not changed (the shipped matrix: ~100 ms of YAML parsing, a few ms from here).

An entry is plain JSON, never pickle: loading a cache must not be able to run code. Each
entry is named by a digest of everything it was made from, and carries that digest and
a checksum of its body; anything unexpected (truncated, corrupt, another format, another
key, a link, a file someone else owns) is a miss, and the caller rebuilds it.

Safe when several users share a machine: the folder is per user (`dirs.user_cache_dir`:
GPUENV_CACHE_DIR, else ~/.cache/gpuenv), created 0700 and used only while it is ours and
nobody else can write to it; files are opened without following links and written
atomically (a temporary file in the same folder, then os.replace). A folder we cannot
use means no cache, never an error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import stat
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from gpuenv.common import nesting
from gpuenv.common.dirs import make_user_dir, user_cache_dir
from gpuenv.common.versions import ComputeCapability, DriverVersion

FORMAT = 2  # 2: driver versions and compute capabilities as their text
KEEP = 8  # entries of one kind kept; older ones are removed when a new one is written
MAX_BYTES = 64 << 20
_STALE_TEMP_SECONDS = 600
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_Plain = TypeVar("_Plain", str, int, list[Any])


def digest(sources: Iterable[tuple[str, bytes]]) -> str:
    """One sha256 over named byte strings, each framed by its length so that no two
    different lists of sources can run together into the same bytes."""
    hasher = hashlib.sha256(f"gpuenv-cache-{FORMAT}\n".encode())
    for name, data in sources:
        label = name.encode()
        hasher.update(b"%d:%s\n%d:" % (len(label), label, len(data)))
        hasher.update(data)
    return hasher.hexdigest()


def load(kind: str, key: str, directory: str | None = None) -> Any | None:
    """The data stored for `key`, or None when there is none we can trust."""
    try:
        folder = _open_folder(directory or user_cache_dir(), create=False)
    except OSError:
        return None
    try:
        fd = os.open(_entry(kind, key), os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
    except OSError:
        return None
    finally:
        os.close(folder)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            return None
        if info.st_size > MAX_BYTES:
            return None
        with os.fdopen(fd, "rb", closefd=False) as handle:
            raw = handle.read(MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return _decode(raw, key)


def store(kind: str, key: str, data: Any, directory: str | None = None) -> bool:
    """Write `data` for `key`: JSON's types, and frozen dataclasses as the lists of
    their fields that `rows` rebuilds them from. False when it could not be written."""
    body = json.dumps(data, separators=(",", ":"), ensure_ascii=False, default=_fields).encode()
    header = json.dumps(
        {"format": FORMAT, "key": key, "sha256": hashlib.sha256(body).hexdigest()}
    ).encode()
    try:
        folder = _open_folder(directory or user_cache_dir(), create=True)
    except OSError:
        return False
    temp = f".{kind}.{os.getpid()}.{os.urandom(6).hex()}.tmp"
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600, dir_fd=folder)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(header + b"\n" + body)
        except BaseException:
            os.unlink(temp, dir_fd=folder)
            raise
        os.replace(temp, _entry(kind, key), src_dir_fd=folder, dst_dir_fd=folder)
        _prune(folder, kind, keep=_entry(kind, key))
        return True
    except OSError:
        return False
    finally:
        os.close(folder)


def rows(cls: type[Any], value: Any) -> tuple[Any, ...]:
    """Dataclass instances from the lists of fields `store` wrote.

    The body's checksum and key already say these are the bytes this code wrote from
    validated data, so only the shape is checked here (ValueError, TypeError), not each
    value again: that would cost more than the rest of a load.
    """
    converters = [
        (index, _CONVERTERS[str(f.type)])
        for index, f in enumerate(dataclasses.fields(cls))
        if str(f.type) in _CONVERTERS
    ]
    size = len(dataclasses.fields(cls))
    out = []
    for values in checked(list, value):
        if not isinstance(values, list) or len(values) != size:
            raise ValueError(f"a {cls.__name__} is a list of its {size} fields")
        for index, convert in converters:
            values[index] = convert(values[index])
        out.append(cls(*values))
    return tuple(out)


def checked(kind: type[_Plain], value: Any) -> _Plain:
    """`value` when it is a `kind` (never a bool for int); ValueError otherwise."""
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"expected {kind.__name__}, got {type(value).__name__}")
    return value


def _fields(value: Any) -> Any:
    if isinstance(value, DriverVersion | ComputeCapability):
        return str(value)  # as written; parsed again (cached) on the way back
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [getattr(value, f.name) for f in dataclasses.fields(value)]
    raise TypeError(f"{type(value).__name__} cannot be cached")


def _str_tuples(value: list[list[str]]) -> tuple[tuple[str, ...], ...]:
    return tuple(map(tuple, value))


def _optional(parse: Callable[[str], Any]) -> Callable[[str | None], Any]:
    return lambda text: None if text is None else parse(text)


# Fields JSON gives back as lists or text, by annotation: how they become tuples and
# values again.
_CONVERTERS: dict[str, Callable[[Any], Any]] = {
    "tuple[str, ...]": tuple,
    "tuple[tuple[str, ...], ...]": _str_tuples,
    "DriverVersion": DriverVersion.parse,
    "DriverVersion | None": _optional(DriverVersion.parse),
    "tuple[DriverVersion, ...]": lambda texts: tuple(map(DriverVersion.parse, texts)),
    "ComputeCapability": ComputeCapability.parse,
    "ComputeCapability | None": _optional(ComputeCapability.parse),
}


def _entry(kind: str, key: str) -> str:
    return f"{kind}-{key[:32]}.json"


def _decode(raw: bytes, key: str) -> Any | None:
    head, newline, body = raw.partition(b"\n")
    if not newline:
        return None
    try:
        header = nesting.loads(json.loads, head)
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            return None
        if header.get("key") != key or header.get("sha256") != hashlib.sha256(body).hexdigest():
            return None
        return nesting.loads(json.loads, body)
    except ValueError:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None


def _open_folder(path: str, *, create: bool) -> int:
    """A descriptor of the cache folder, which must be ours and writable by us alone."""
    if create:
        make_user_dir(path)
    fd = os.open(path, os.O_RDONLY | _DIRECTORY | _NOFOLLOW)
    try:
        info = os.fstat(fd)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            raise PermissionError(f"{path} is not a folder of this user")
        if stat.S_IMODE(info.st_mode) & 0o077:
            os.fchmod(fd, 0o700)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _prune(folder: int, kind: str, keep: str) -> None:
    """Keep the newest KEEP entries of `kind`, and no temporary file left by a crash."""
    entries: list[tuple[float, str]] = []
    stale = time.time() - _STALE_TEMP_SECONDS
    for name in os.listdir(folder):
        with contextlib.suppress(OSError):
            modified = os.stat(name, dir_fd=folder, follow_symlinks=False).st_mtime
            if name.startswith(f".{kind}.") and name.endswith(".tmp") and modified < stale:
                os.unlink(name, dir_fd=folder)
            elif name.startswith(f"{kind}-") and name.endswith(".json") and name != keep:
                entries.append((modified, name))
    entries.sort(reverse=True)
    for _, name in entries[KEEP - 1 :]:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=folder)
