"""GPU history for `gpuenv dashboard`: one SQLite database per sampling user in the state
folder, written by one sampler at a time and read only by its own user's processes.

Layout: `<state>/history-<uid>/` holds `gpus.sqlite` (0600), `sampler.lock` (0600) and
`xids.json` (0644: the XIDs of the last day, which `top` and `doctor` of every user read).
The folder is made by its user (0755) in the state folder, which is root-owned and
sticky where users share it, so nobody else can rename, replace or add files in it
(SQLite's journal included); a folder or file that is a symlink, or that another user
owns, is refused. No other user opens the database: nobody can hold a lock on it that
stalls the sampler, and a journal left by a killed sampler is rolled back by the next
opener, which may write it.

One sampler per database: it holds `sampler.lock` (flock) while it runs; the kernel drops
the lock when it dies, SIGKILL included. The database is capped (`max_mib`); retention
deletes older rows on every sampling round.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sqlite3
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpuenv.common import nesting
from gpuenv.common.files import read_up_to
from gpuenv.errors import GpuenvError, StateUnsafe
from gpuenv.host.machine import Gpu
from gpuenv.monitoring.health import Finding, recorded_xid
from gpuenv.reservations.statedir import Folder, open_state, owner_name

DATABASE = "gpus.sqlite"
SAMPLER_LOCK = "sampler.lock"
XIDS_FILE = "xids.json"
MAX_XIDS_FILE = 256 * 1024  # the last day's XIDs, at most MAX_XIDS of them
MAX_XIDS = 1000
SCHEMA_VERSION = "1"
# Readings kept per sample, in the order of the table's columns after (t, gpu, idx).
READINGS = (
    "utilization",
    "memory_used_mib",
    "memory_total_mib",
    "temperature_c",
    "power_w",
    "power_limit_w",
    "sm_clock_mhz",
)
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS samples(
    t REAL NOT NULL, gpu TEXT NOT NULL, idx INTEGER NOT NULL, name TEXT NOT NULL,
    {", ".join(f"{column} REAL" for column in READINGS)});
CREATE INDEX IF NOT EXISTS samples_by_gpu ON samples(gpu, t);
CREATE INDEX IF NOT EXISTS samples_by_time ON samples(t);
CREATE TABLE IF NOT EXISTS xids(
    t REAL NOT NULL, gpu TEXT NOT NULL, idx INTEGER NOT NULL, xid INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS xids_by_time ON xids(t);
"""


@dataclass(frozen=True)
class Xid:
    at: float
    gpu: str  # the GPU's key (UUID, else index)
    index: int
    xid: int

    def to_data(self) -> dict[str, Any]:
        return {"at": self.at, "gpu": self.gpu, "index": self.index, "xid": self.xid}


def history_folder(uid: int) -> str:
    return f"history-{uid}"


def _own_folder(folder: Folder, uid: int, *, create: bool) -> int | None:
    """The descriptor of `history-<uid>` in the state folder, checked: a directory (not a
    symlink), owned by `uid`, writable by its owner only. None when it does not exist."""
    name = history_folder(uid)
    made = False
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=folder.fd)
            made = True
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=folder.fd)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP (a symlink), ENOTDIR (a file): planted by someone
        raise StateUnsafe(
            f"{os.path.join(folder.path, name)} is not a folder gpuenv made "
            f"({exc.strerror}): the dashboard's history is not kept there",
            hint=f"remove it (its owner or root): `rm {os.path.join(folder.path, name)}`",
        ) from None
    info = os.fstat(fd)
    if info.st_uid != uid or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        os.close(fd)
        raise StateUnsafe(
            f"{os.path.join(folder.path, name)} belongs to {owner_name(info.st_uid)} or may "
            "be written by others: the dashboard's history is not kept there",
            hint=f"its owner or root removes it: `rm -r {os.path.join(folder.path, name)}`",
        )
    if made:
        os.fchmod(fd, 0o755)  # whatever the umask: others read xids.json in it
    return fd


def _check_database(directory: int, where: str, uid: int) -> bool:
    """Whether the database exists; refused when it is not a regular file of `uid`'s."""
    try:
        info = os.stat(DATABASE, dir_fd=directory, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(info.st_mode) or info.st_uid != uid:
        raise StateUnsafe(
            f"{where} is not a database of {owner_name(uid)}'s: the history is not read",
            hint=f"remove it: `rm {where}`",
        )
    return True


class SamplerBusy(Exception):
    """Another process already samples into this database."""


def _sampler_lock(directory: int, uid: int, where: str) -> int:
    """The sampler's lock, held: a regular file of `uid`'s that only `uid` can open (an
    other user's read-only descriptor could otherwise take the flock)."""
    lock = os.open(
        SAMPLER_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=directory
    )
    info = os.fstat(lock)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != uid:
        os.close(lock)
        raise StateUnsafe(
            f"{where}/{SAMPLER_LOCK} is not a lock file of {owner_name(uid)}'s",
            hint=f"remove it: `rm {where}/{SAMPLER_LOCK}`",
        )
    os.fchmod(lock, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock)
        raise SamplerBusy(where) from None
    return lock


class History:
    """One user's GPU history database."""

    def __init__(
        self, connection: sqlite3.Connection, path: str, directory: int, lock: int | None
    ) -> None:
        self.connection = connection
        self.path = path
        self._directory = directory  # history-<uid>, for xids.json
        self._lock = lock  # the sampler's flock, held while this writes

    @classmethod
    def for_sampling(cls, folder: Folder, max_mib: int) -> History:
        """This user's history, opened to write; SamplerBusy when another process samples."""
        uid = os.getuid()
        directory = _own_folder(folder, uid, create=True)
        assert directory is not None  # just made, or refused above
        try:
            lock = _sampler_lock(directory, uid, os.path.join(folder.path, history_folder(uid)))
            path = os.path.join(folder.path, history_folder(uid), DATABASE)
            _check_database(directory, path, uid)
            connection = sqlite3.connect(path, timeout=10, check_same_thread=False)
        except BaseException:
            os.close(directory)
            raise
        os.chmod(path, 0o600)
        page_size = connection.execute("PRAGMA page_size").fetchone()[0]
        connection.execute(f"PRAGMA max_page_count = {max(1, max_mib * 2**20 // page_size)}")
        connection.executescript(_SCHEMA)
        connection.execute(
            "INSERT OR REPLACE INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,)
        ).connection.commit()
        return cls(connection, path, directory, lock)

    @classmethod
    def for_reading(cls, folder: Folder) -> History | None:
        """This user's own history, None when it has none. Opened so that it may roll
        back what a killed sampler left half-written (only its owner can)."""
        uid = os.getuid()
        directory = _own_folder(folder, uid, create=False)
        if directory is None:
            return None
        path = os.path.join(folder.path, history_folder(uid), DATABASE)
        try:
            if not _check_database(directory, path, uid):
                os.close(directory)
                return None
            connection = sqlite3.connect(
                f"file:{path}?mode=rw", uri=True, timeout=5, check_same_thread=False
            )
        except BaseException:
            os.close(directory)
            raise
        return cls(connection, path, directory, None)

    def close(self) -> None:
        self.connection.close()
        os.close(self._directory)
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    # -- writing (the sampler) ------------------------------------------------------------

    def record(self, now: float, gpus: Sequence[Gpu], xids: Sequence[Xid]) -> None:
        """One sampling round. A full database drops its oldest tenth and tries again."""
        rows = [
            (now, gpu.key, gpu.index, gpu.name, *(getattr(gpu, column) for column in READINGS))
            for gpu in gpus
        ]
        marks = ", ".join("?" * (4 + len(READINGS)))
        for attempt in range(2):
            try:
                with self.connection:
                    self.connection.executemany(f"INSERT INTO samples VALUES ({marks})", rows)
                    self.connection.executemany(
                        "INSERT INTO xids VALUES (?, ?, ?, ?)",
                        [(x.at, x.gpu, x.index, x.xid) for x in xids],
                    )
                return
            except sqlite3.OperationalError as exc:
                if attempt or "full" not in str(exc):
                    raise
                self._drop_oldest()

    def _drop_oldest(self) -> None:
        oldest, newest = self.connection.execute("SELECT min(t), max(t) FROM samples").fetchone()
        if oldest is None:
            return
        cut = oldest + (newest - oldest) / 10
        with self.connection:
            self.connection.execute("DELETE FROM samples WHERE t <= ?", (cut,))
            self.connection.execute("DELETE FROM xids WHERE t <= ?", (cut,))

    def prune(self, before: float) -> None:
        """Retention: forget what is older than `before`."""
        with self.connection:
            self.connection.execute("DELETE FROM samples WHERE t < ?", (before,))
            self.connection.execute("DELETE FROM xids WHERE t < ?", (before,))

    # -- reading ----------------------------------------------------------------------------

    def last_sample(self) -> float | None:
        row = self.connection.execute("SELECT max(t) FROM samples").fetchone()
        return float(row[0]) if row and row[0] is not None else None

    def series(
        self, gpu: str, since: float, points: int = 240, now: float | None = None
    ) -> list[dict[str, Any]]:
        """GPU `gpu`'s readings since `since`, averaged into at most `points` buckets."""
        now = time.time() if now is None else now
        width = max(1.0, (now - since) / points)
        averages = ", ".join(f"avg({column})" for column in READINGS)
        cursor = self.connection.execute(
            f"SELECT min(t), {averages} FROM samples WHERE gpu = ? AND t >= ? "
            "GROUP BY CAST((t - ?) / ? AS INTEGER) ORDER BY 1",
            (gpu, since, since, width),
        )
        return [
            {"t": row[0], **dict(zip(READINGS, map(_number, row[1:]), strict=True))}
            for row in cursor.fetchall()
        ]

    def publish_xids(self, since: float) -> None:
        """Write the XIDs recorded since `since` to xids.json, for every user's `top` and
        `doctor` (they never open the database): a new file renamed over the old one."""
        data = {"xids": [x.to_data() for x in self.xids(since, MAX_XIDS)]}
        temp = f".{XIDS_FILE}.{os.getpid()}.tmp"
        fd = os.open(
            temp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
            0o644,
            dir_fd=self._directory,
        )
        try:
            os.fchmod(fd, 0o644)
            os.write(fd, json.dumps(data).encode())
        finally:
            os.close(fd)
        os.replace(temp, XIDS_FILE, src_dir_fd=self._directory, dst_dir_fd=self._directory)

    def has_xid(self, gpu: str, xid: int, since: float) -> bool:
        """Whether `xid` of `gpu` is recorded since `since`."""
        cursor = self.connection.execute(
            "SELECT 1 FROM xids WHERE gpu = ? AND xid = ? AND t >= ? LIMIT 1", (gpu, xid, since)
        )
        return cursor.fetchone() is not None

    def xids(self, since: float, limit: int = 200) -> list[Xid]:
        cursor = self.connection.execute(
            "SELECT t, gpu, idx, xid FROM xids WHERE t >= ? ORDER BY t DESC LIMIT ?",
            (since, limit),
        )
        return [Xid(float(t), str(gpu), int(idx), int(xid)) for t, gpu, idx, xid in cursor]


def _number(value: Any) -> float | None:
    return None if value is None else round(float(value), 2)


RECENT_XIDS = 86400.0  # `top` and `doctor` show the XIDs a sampler recorded in the last day


def _read_xids_file(folder: Folder, uid: int) -> list[Xid]:
    """`uid`'s published XIDs: a regular file of theirs in their own history folder, of
    bounded size; nothing where there is none or it is not to be trusted."""
    directory = _own_folder(folder, uid, create=False)
    if directory is None:
        return []
    try:
        fd = os.open(XIDS_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=directory)
    except OSError:
        return []
    finally:
        os.close(directory)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != uid:
            return []
        data = nesting.loads(json.loads, read_up_to(fd, MAX_XIDS_FILE)[:MAX_XIDS_FILE] or b"{}")
    except (OSError, ValueError):
        return []
    finally:
        os.close(fd)
    found = []
    for entry in (data.get("xids") if isinstance(data, dict) else None) or []:
        try:
            found.append(
                Xid(float(entry["at"]), str(entry["gpu"]), int(entry["index"]), int(entry["xid"]))
            )
        except (KeyError, TypeError, ValueError):
            continue
    return found[:MAX_XIDS]


def recorded_xids(since: float) -> list[Xid]:
    """The XIDs the samplers recorded since `since`: root's sampler's and this user's
    own (their published xids.json). Nothing, never an error, where there is none."""
    try:
        folder = open_state()
    except GpuenvError:
        return []
    found: dict[tuple[float, str, int], Xid] = {}
    try:
        for uid in dict.fromkeys((0, os.getuid())):
            try:
                for xid in _read_xids_file(folder, uid):
                    if xid.at >= since:
                        found[(xid.at, xid.gpu, xid.xid)] = xid
            except GpuenvError:
                continue  # doctor's state-folder check says what is wrong there
    finally:
        folder.close()
    return sorted(found.values(), key=lambda x: x.at)


def recorded_findings(gpus: Sequence[Gpu], now: float | None = None) -> list[Finding]:
    """A finding for each XID a sampler recorded on these GPUs in the last day, with when:
    a past event, so at most a warning (the GPU may have been reset since)."""
    since = (time.time() if now is None else now) - RECENT_XIDS
    keys = {gpu.key: gpu.index for gpu in gpus}
    return [
        recorded_xid(keys[xid.gpu], xid.xid, xid.at)
        for xid in recorded_xids(since)
        if xid.gpu in keys
    ]
