"""Content digests of a project's files, remembered by what `stat` says of them, as git's
index remembers them: a baked build hashes every file for its tag, and a file unchanged
since the last build (same size, modification and change times, inode) is not read again
for it. So the build's stream of the context is, for such a file, its only read.

Kept in the per-user cache (`common.cache`: JSON, checked, never shared with another
user); a cache that cannot be read or written means every file is hashed, never an error.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from gpuenv.common import cache

KIND = "file-digests"
CHUNK = 1 << 20


def file_digest(path: str) -> str:
    """The sha256 of a file, read in chunks (memory independent of its size)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class Digests:
    """The digests of one project folder's files, remembered between builds."""

    def __init__(self, project_dir: str) -> None:
        self.key = cache.digest([("project", os.path.abspath(project_dir).encode())])
        known = cache.load(KIND, self.key)
        self.known: dict[str, Any] = known if isinstance(known, dict) else {}
        self.seen: dict[str, list[Any]] = {}
        self.read = 0  # files read to hash them (a miss)

    def of(self, path: str) -> str:
        """The sha256 of the file at `path`: remembered while its stat is unchanged."""
        info = os.stat(path, follow_symlinks=False)
        stamp = [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino]
        remembered = self.known.get(path)
        if (
            isinstance(remembered, list)
            and remembered[:4] == stamp
            and isinstance(remembered[4:5] and remembered[4], str)
        ):
            digest = str(remembered[4])
        else:
            digest = file_digest(path)
            self.read += 1
        self.seen[path] = [*stamp, digest]
        return digest

    def save(self) -> None:
        """Remember what was hashed (only this build's files: removed ones go)."""
        if self.seen != self.known:
            cache.store(KIND, self.key, self.seen)
