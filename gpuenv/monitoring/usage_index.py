"""An index of the usage records in SQLite, so that `gpuenv usage` and the dashboard's
`/api/usage` answer a year of a busy lab's runs (50,000, 14 MB of records) in a few tens of
milliseconds, in memory that does not grow with them.

Decided: SQLite (the standard library's), not a rollup. The records stay the truth; the
index is a copy of what was read from them, per reader, in the reader's cache folder
(`usage-<folder>.sqlite`, 0600): root's holds every user's runs, a user's their own,
as `UsageLog.runs` reads them. A rollup by hour or day would lose the exact edge of
`--since 90m` and of a run that spans it; SQL sums the exact overlap of each run.

Each owner's file is read from where the last reading stopped: its inode, the offset of
the last whole line taken, and the sha256 of everything before it are kept, and a file
that was rewritten, truncated or replaced (the prefix differs) is read again from its
start. Only start and end records that `UsageLog.runs` would believe go in (a start of
the file's owner, ids as gpuenv writes them); what depends on the moment (a run without
an end: running, or ended unrecorded) is decided when asked, for those runs only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import stat
from collections.abc import Iterator
from typing import Any

from gpuenv.common import nesting
from gpuenv.common.dirs import make_user_dir, user_cache_dir
from gpuenv.monitoring.usage_files import MAX_FILE

SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
  owner INTEGER PRIMARY KEY, inode INTEGER, offset INTEGER, mtime INTEGER, prefix TEXT);
CREATE TABLE IF NOT EXISTS runs (
  run INTEGER PRIMARY KEY, owner INTEGER, id TEXT, project TEXT, start REAL,
  start_record TEXT, end_at REAL, end_record TEXT, UNIQUE (owner, id));
CREATE INDEX IF NOT EXISTS runs_end ON runs (end_at);
CREATE TABLE IF NOT EXISTS gpus (run INTEGER, model TEXT, count INTEGER);
CREATE INDEX IF NOT EXISTS gpus_run ON gpus (run);
"""
VERSION = 2  # of the schema; another one is dropped and read again
CHUNK = 1 << 20
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _valid_id(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= 32 and value.isascii() and value.isalnum()


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if number == number and abs(number) != float("inf") else None


def index_path(state_directory: str) -> str:
    name = hashlib.sha256(os.path.abspath(state_directory).encode()).hexdigest()[:16]
    return os.path.join(user_cache_dir(), f"usage-{name}.sqlite")


@contextlib.contextmanager
def opened(state_directory: str) -> Iterator[sqlite3.Connection | None]:
    """The index for this reader (None where the cache folder cannot hold one: the
    records are then read whole, as before)."""
    path = index_path(state_directory)
    try:
        make_user_dir(os.path.dirname(path))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        info = os.fstat(fd)
        os.close(fd)
        if info.st_uid != os.getuid() or not stat.S_ISREG(info.st_mode):
            raise OSError("not ours")
        connection = sqlite3.connect(path, timeout=10, isolation_level=None)
    except (OSError, sqlite3.Error):
        yield None
        return
    try:
        version = connection.execute("PRAGMA user_version").fetchone()[0]
        if version != VERSION:
            for table in ("files", "starts", "gpus", "ends", "runs"):
                connection.execute(f"DROP TABLE IF EXISTS {table}")
            connection.executescript(SCHEMA)
            connection.execute(f"PRAGMA user_version = {VERSION}")
        yield connection
    except sqlite3.Error:
        yield None
    finally:
        connection.close()


def refresh(connection: sqlite3.Connection, directory: int, owner: int, name: str) -> None:
    """Take in what `owner`'s records file (`name` in the usage folder `directory`) has
    that the index has not: from the last offset, or from the start when the file is not
    the one read before. A file that is not a regular file of its owner's is left out."""
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=directory)
    except OSError:
        return
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != owner or info.st_size > MAX_FILE:
            return
        known = connection.execute(
            "SELECT inode, offset, prefix, mtime FROM files WHERE owner = ?", (owner,)
        ).fetchone()
        if known is not None and (known[0], known[1], known[3]) == (
            info.st_ino,
            info.st_size,
            info.st_mtime_ns,
        ):
            return  # not written since it was read
        offset, digest = _resume(handle, info, known)
        connection.execute("BEGIN")
        try:
            if offset == 0:
                _forget(connection, owner)
            offset, digest = _take(connection, handle, owner, offset, digest)
            mtime = info.st_mtime_ns if offset == info.st_size else -1  # a line to come
            connection.execute(
                "INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?)",
                (owner, info.st_ino, offset, mtime, digest.hexdigest()),
            )
            connection.execute("COMMIT")
        except BaseException:
            connection.execute("ROLLBACK")
            raise


def _resume(handle: Any, info: os.stat_result, known: Any) -> tuple[int, Any]:
    """Where to read from, and the running digest of what comes before it."""
    digest = hashlib.sha256()
    if known is None or known[0] != info.st_ino or known[1] > info.st_size:
        return 0, digest
    left = known[1]
    while left:
        chunk = handle.read(min(CHUNK, left))
        if not chunk:
            return 0, hashlib.sha256()
        digest.update(chunk)
        left -= len(chunk)
    if digest.hexdigest() != known[2]:
        handle.seek(0)
        return 0, hashlib.sha256()
    return known[1], digest


def _forget(connection: sqlite3.Connection, owner: int) -> None:
    connection.execute(
        "DELETE FROM gpus WHERE run IN (SELECT run FROM runs WHERE owner = ?)", (owner,)
    )
    connection.execute("DELETE FROM runs WHERE owner = ?", (owner,))
    connection.execute("DELETE FROM files WHERE owner = ?", (owner,))


def _take(
    connection: sqlite3.Connection, handle: Any, owner: int, offset: int, digest: Any
) -> tuple[int, Any]:
    """Read whole lines from `offset` on; a line without its end (a write in progress)
    waits for the next reading."""
    rest = b""
    while chunk := handle.read(CHUNK):
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        for line in lines:
            _record(connection, owner, line)
            digest.update(line + b"\n")
            offset += len(line) + 1
    return offset, digest


def _record(connection: sqlite3.Connection, owner: int, line: bytes) -> None:
    try:
        record = nesting.loads(json.loads, line)
    except ValueError:
        return  # a line torn by a crash
    if not isinstance(record, dict) or not _valid_id(record.get("id")):
        return
    run_id = record["id"]
    if record.get("event") == "start" and record.get("uid") == owner:
        _start(connection, owner, run_id, record, line)
    elif record.get("event") == "end":
        connection.execute(
            """
            INSERT INTO runs (owner, id, end_at, end_record) VALUES (?, ?, ?, ?)
            ON CONFLICT (owner, id) DO UPDATE SET end_at = excluded.end_at,
              end_record = excluded.end_record WHERE runs.end_record IS NULL
            """,
            (owner, run_id, _number(record.get("end")), line.decode(errors="replace")),
        )


def _start(
    connection: sqlite3.Connection, owner: int, run_id: str, record: dict[str, Any], line: bytes
) -> None:
    """A run's start record (its first one counts, as `UsageLog.runs` counts it)."""
    began, gpus = _number(record.get("start")), record.get("gpus", [])
    project = record.get("project", "?")
    if began is None or not isinstance(gpus, list) or not isinstance(project, str):
        return
    if not all(isinstance(g, dict) for g in gpus):
        return
    taken = connection.execute(
        """
        INSERT INTO runs (owner, id, project, start, start_record) VALUES (?, ?, ?, ?, ?)
        ON CONFLICT (owner, id) DO UPDATE SET project = excluded.project,
          start = excluded.start, start_record = excluded.start_record
          WHERE runs.start_record IS NULL
        """,
        (owner, run_id, project, began, line.decode(errors="replace")),
    ).rowcount
    if not taken:
        return
    (run,) = connection.execute(
        "SELECT run FROM runs WHERE owner = ? AND id = ?", (owner, run_id)
    ).fetchone()
    models: dict[str, int] = {}
    for gpu in gpus:
        model = str(gpu.get("model") or "unknown")
        models[model] = models.get(model, 0) + 1
    connection.executemany(
        "INSERT INTO gpus VALUES (?, ?, ?)", [(run, m, n) for m, n in models.items()]
    )


KEYS = {"user": "r.owner", "project": "r.project", "gpu": "g.model"}
ENDED = """r.start_record IS NOT NULL AND r.end_at IS NOT NULL AND r.end_at >= :since
  AND (:only IS NULL OR r.owner = :only)"""


def ended_sums(
    connection: sqlite3.Connection, by: str, since: float, now: float, only: int | None
) -> Iterator[tuple[Any, str, int, float]]:
    """(key, model, runs, GPU-hours) of the runs with a recorded end, summed in SQL: the
    exact overlap of each run with [since, now], times its GPUs of that model. `key` is
    the owner's uid for `user`, the project, or the GPU model."""
    return iter(
        connection.execute(
            f"""
            SELECT {KEYS[by]}, g.model, COUNT(*),
                   SUM(MAX(0.0, MIN(r.end_at, :now) - MAX(r.start, :since)) * g.count) / 3600.0
            FROM runs r JOIN gpus g ON g.run = r.run
            WHERE {ENDED}
            GROUP BY {KEYS[by]}, g.model
            """,
            {"since": since, "now": now, "only": only},
        )
    )


def ended_runs_by_key(
    connection: sqlite3.Connection, by: str, since: float, only: int | None
) -> Iterator[tuple[Any, int]]:
    """(key, runs) of the runs with a recorded end at or after `since`, for `user` and
    `project` (a run on GPUs of two models counts once); none for `gpu`, whose counts
    come with `ended_sums`."""
    if by == "gpu":
        return iter(())
    return iter(
        connection.execute(
            f"SELECT {KEYS[by]}, COUNT(*) FROM runs r WHERE {ENDED} GROUP BY {KEYS[by]}",
            {"since": since, "only": only},
        )
    )


def open_starts(
    connection: sqlite3.Connection, only: int | None
) -> Iterator[tuple[int, str, str, str | None]]:
    """(owner, id, start record, end record or None) of every run without a usable end."""
    return iter(
        connection.execute(
            """
            SELECT owner, id, start_record, end_record FROM runs
            WHERE start_record IS NOT NULL AND end_at IS NULL
              AND (:only IS NULL OR owner = :only)
            """,
            {"only": only},
        )
    )
