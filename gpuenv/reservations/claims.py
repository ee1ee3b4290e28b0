"""GPU reservations on one shared host: claims that never collide and cannot be forged.

Check and claim happen under one file lock, and the claim is on disk before the lock is
released, so two runs can never take the same GPU. Claims live in the state folder
(`statedir`): root-owned and sticky where users share it, so any user adds claims and
nobody removes another user's.

A claim's owner is the owner of its file (fstat), whatever the file says; a file whose
content disagrees with its owner, or that is not a plain JSON claim, is ignored and
listed in `problems` (`gpuenv doctor` reports them). A claim counts while what holds it
lives: a process that holds a write lock on the claim's file (the kernel drops it when
the process dies, SIGKILL included; no /proc needed, and any user can ask). For a run in
the foreground that is its gpuenv process; for a detached run, its keeper
(`gpuenv.app.keeper`), which inherits the locked files and lives as long as the run's
container. So no engine is ever asked whether a claim counts: on a server where each
user has their own engine (rootless Podman or Docker), another user's claim counts the
same, and no engine call is made under the store's lock. Claims written on another host
count only in a folder the admin marked as shared between hosts, and only while their
heartbeat (the file's mtime, refreshed by the run or its keeper) is fresh.

Where a site runs dcgm-exporter, the store keeps its job mapping (`jobmap`) in step
whenever claims are taken, released or found dead, if this process may write it: under
the store's lock when it is free, skipped when another process holds it (whoever reads
the claims next catches up), so that keeping it never delays or fails a run.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gpuenv.common import nesting
from gpuenv.common.text import visible
from gpuenv.errors import GpuenvError, LockHeld
from gpuenv.host.detect import detect_host
from gpuenv.host.procfs import process_start
from gpuenv.reservations.jobmap import keep_claims, open_job_map, slots
from gpuenv.reservations.statedir import (
    STATE_ENV,
    Folder,
    hold,
    is_held,
    lock_timeout,
    locked,
    open_state,
    owner_name,
)

__all__ = ["STATE_ENV", "Claim", "ClaimStore", "Waiter"]

HEARTBEAT_INTERVAL = 60.0  # how often a run refreshes its claims' mtime
HEARTBEAT_EXPIRY = 300.0  # a claim of another host without a fresher heartbeat is stale
TICKET_EXPIRY = 15.0  # a waiter refreshes its ticket twice a second; older ones are stale
MAX_FILE = 64 * 1024
CLAIM_PREFIX = "claim."
TICKET_PREFIX = "queue."


@dataclass(frozen=True)
class Claim:
    gpu: str  # the GPU's UUID, or its index where UUIDs are unknown
    user: str
    uid: int
    pid: int  # the gpuenv process holding it; 0 for a detached run's claim
    pid_start: str
    host: str
    project: str
    since: float
    container: str = ""  # a detached run's container (its keeper holds the claim)
    run: str = ""  # that run's name, as `gpuenv ps` shows it

    def describe(self) -> str:
        held = time.strftime("%H:%M", time.localtime(self.since))
        if self.run:
            holder = f"run {visible(self.run)}"
        else:
            holder = f"container {self.container[:12]}" if self.container else f"pid {self.pid}"
        return f"{self.user} ({self.project}, {holder}, since {held})"


@dataclass(frozen=True)
class Waiter:
    user: str
    pid: int
    since: float

    def describe(self) -> str:
        since = time.strftime("%H:%M", time.localtime(self.since))
        return f"{self.user} (pid {self.pid}, since {since})"


def _text(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise ValueError(f"'{key}' is not a string")
    return value


def _number(data: Mapping[str, Any], key: str) -> int:
    value = data.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"'{key}' is not a number")
    return value


def _safe(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in text)[:80]


class ClaimStore:
    """The claims and the wait queue in one state folder."""

    def __init__(
        self,
        directory: str | None = None,
        *,
        env: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.folder: Folder = open_state(env, directory)
        self.directory = self.folder.path
        self.timeout = lock_timeout(env)
        self.clock = clock
        self.problems: list[str] = []
        self.hostname = socket.gethostname()
        self._held: dict[str, int] = {}  # our live claims and tickets: their locked fds
        self._locked = False
        self.job_map, problem = open_job_map(env)
        self.job_map_problems = [problem] if problem else []
        self._gpu_names: dict[str, str] | None = None  # this host's GPUs -> mapping files

    def close(self) -> None:
        """Close the folder; claims still held stay held (and live) until exit."""
        self.folder.close()
        if self.job_map is not None:
            self.job_map.close()

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The one lock around check-and-claim, with a timeout that names its holder."""
        with locked(self.folder, self.timeout):
            self._locked = True
            try:
                yield
            finally:
                self._locked = False

    @contextlib.contextmanager
    def _lock_if_free(self) -> Iterator[bool]:
        """The store's lock (already held, or taken without waiting), or False while
        another process holds it: the job mapping then waits for the next reader."""
        if self._locked:
            yield True
            return
        stack = contextlib.ExitStack()
        try:
            stack.enter_context(locked(self.folder, 0))
        except LockHeld:
            free = False
        except (GpuenvError, OSError) as exc:
            self.job_map_problems.append(f"the dcgm-exporter job mapping is not kept: {exc}")
            free = False
        else:
            free = True
        with stack:
            self._locked = free
            try:
                yield free
            finally:
                self._locked = False

    def _host_gpus(self) -> Mapping[str, str] | None:
        """This host's GPUs by claim key -> their mapping files, read once (not from the
        claims, which their users write); None, a problem noted, where it cannot be read."""
        if self._gpu_names is None:
            try:
                self._gpu_names = slots(detect_host())
            except (GpuenvError, OSError) as exc:
                self.job_map_problems.append(f"the dcgm-exporter job mapping is not kept: {exc}")
        return self._gpu_names

    def _keep_job_map(self, live: Sequence[Claim], names: Mapping[str, str]) -> None:
        """Write dcgm-exporter's job mapping from `live`, read under the store's lock so
        that an older view never overwrites a newer one. A mapping that cannot be kept is
        a problem to report, never a failed run."""
        if self.job_map is None:
            return
        try:
            keep_claims(self.job_map, live, self.hostname, names)
        except (GpuenvError, OSError) as exc:
            self.job_map_problems.append(f"the dcgm-exporter job mapping is not kept: {exc}")
        self.job_map_problems.extend(self.job_map.problems)
        self.job_map.problems.clear()

    # -- files ---------------------------------------------------------------------------

    def _names(self, prefix: str) -> list[str]:
        try:
            names = os.listdir(self.folder.fd)
        except OSError:
            return []
        return sorted(n for n in names if n.startswith(prefix) and n.endswith(".json"))

    def _read(self, name: str) -> tuple[dict[str, Any], os.stat_result, bool] | None:
        """A file's JSON, its fstat and whether a live process holds it, or None (a
        problem noted) when it is not a small regular file of JSON: never through a
        link, never blocking on a FIFO."""
        try:
            fd = os.open(
                name,
                os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                dir_fd=self.folder.fd,
            )
        except FileNotFoundError:
            return None  # released meanwhile
        except OSError as exc:
            self._problem(name, None, f"cannot be opened ({exc.strerror})")
            return None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                self._problem(name, info, "is not a regular file")
                return None
            if info.st_size > MAX_FILE:
                self._problem(name, info, f"is larger than {MAX_FILE} bytes")
                return None
            with os.fdopen(os.dup(fd), "rb") as handle:
                raw = handle.read(MAX_FILE + 1)
            held = is_held(fd)
        finally:
            os.close(fd)
        try:
            data = nesting.loads(json.loads, raw)
            if not isinstance(data, dict):
                raise ValueError("not an object")
        except ValueError:
            self._problem(name, info, "is not valid JSON")
            return None
        return data, info, held

    def _problem(self, name: str, info: os.stat_result | None, what: str) -> None:
        owner = f" (owned by {owner_name(info.st_uid)})" if info is not None else ""
        self.problems.append(f"{os.path.join(self.directory, name)}{owner} {what}: ignored")

    def _write(self, name: str, data: Mapping[str, object], *, held: bool) -> str:
        """Write a new file: O_EXCL under a random temporary name, fsynced, renamed to
        `name` (itself random: nobody can have made it first). With `held`, this process
        keeps it locked (and open) until `release`: that is what makes it live."""
        temp = f".tmp.{os.urandom(8).hex()}"
        fd = os.open(
            temp,
            os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o644,
            dir_fd=self.folder.fd,
        )
        try:
            if held:
                hold(fd)
            os.write(fd, json.dumps(data).encode())
            os.fsync(fd)
            os.rename(temp, name, src_dir_fd=self.folder.fd, dst_dir_fd=self.folder.fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=self.folder.fd)
            os.close(fd)
            raise
        if held:
            self._held[name] = fd
        else:
            os.close(fd)
        return name

    def _delete(self, name: str) -> None:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=self.folder.fd)
        fd = self._held.pop(name, None)
        if fd is not None:
            os.close(fd)

    def wait_for_change(self, timeout: float, poll: float = 0.02) -> None:
        """Return when a file of the folder is added or removed (a claim released, a
        ticket gone: the folder's mtime changes), or after `timeout`: how a queued run
        learns at once that GPUs were freed, without taking the lock to look. A holder
        that dies leaves its file (its lock is what ends), which the timeout catches."""
        try:
            seen = os.fstat(self.folder.fd).st_mtime_ns
        except OSError:
            time.sleep(timeout)
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            time.sleep(poll)
            try:
                if os.fstat(self.folder.fd).st_mtime_ns != seen:
                    return
            except OSError:
                return

    def touch(self, names: Sequence[str]) -> None:
        """The heartbeat: refresh the mtime of our own files."""
        for name in names:
            with contextlib.suppress(OSError):
                os.utime(name, dir_fd=self.folder.fd, follow_symlinks=False)

    # -- liveness -------------------------------------------------------------------------

    def _fresh(self, info: os.stat_result, expiry: float) -> bool:
        return self.clock() - info.st_mtime < expiry

    def _consistent(self, name: str, data: Mapping[str, Any], info: os.stat_result) -> bool:
        try:
            uid = _number(data, "uid")
        except ValueError as exc:
            self._problem(name, info, f"is not a gpuenv record ({exc})")
            return False
        if uid != info.st_uid:
            self._problem(name, info, f"says it is uid {uid}'s, but its file is not")
            return False
        return True

    # -- claims ---------------------------------------------------------------------------

    def claims(self) -> list[Claim]:
        """Every claim that counts; dead ones of this user (any, for root) are deleted,
        and the job mapping, where this process keeps one, says who holds what (when
        the lock is free: never waiting for it)."""
        if self.job_map is None:
            return self._live()
        names = self._host_gpus()  # before the lock: NVML may take a moment
        with self._lock_if_free() as free:
            live = self._live()
            if free and names is not None:
                self._keep_job_map(live, names)
        return live

    def _live(self) -> list[Claim]:
        out = []
        me = os.getuid()
        for name in self._names(CLAIM_PREFIX):
            read = self._read(name)
            if read is None:
                continue
            data, info, held = read
            if not self._consistent(name, data, info):
                continue
            try:
                claim = Claim(
                    gpu=_text(data, "gpu"),
                    user=owner_name(info.st_uid),
                    uid=info.st_uid,
                    pid=_number(data, "pid"),
                    pid_start=_text(data, "pid_start"),
                    host=_text(data, "host"),
                    project=_text(data, "project"),
                    since=float(data.get("since") or info.st_mtime),
                    container=str(data.get("container") or ""),
                    run=str(data.get("run") or "")[:128],
                )
            except (ValueError, TypeError) as exc:
                self._problem(name, info, f"is not a gpuenv claim ({exc})")
                continue
            state = self._claim_state(claim, info, held)
            if state == "live":
                out.append(claim)
            elif state == "dead" and (info.st_uid == me or me == 0):
                self._delete(name)
        return out

    def _claim_state(self, claim: Claim, info: os.stat_result, held: bool) -> str:
        """live, dead (its holder is gone: delete it), or ignored (another host's)."""
        if claim.host != self.hostname:
            if self.folder.between_hosts and self._fresh(info, HEARTBEAT_EXPIRY):
                return "live"
            return "ignored"
        return "live" if held else "dead"

    def add(self, gpus: Sequence[str], project: str, container: str = "") -> list[str]:
        """Record claims (call under `locked`), held by this process; returns their names,
        for `release`. With `container`, they name a detached run's container."""
        names = self._add(gpus, project, container)
        self._reread_job_map()
        return names

    def _add(self, gpus: Sequence[str], project: str, container: str, run: str = "") -> list[str]:
        me = _me()
        if container:
            me.update(pid=0, pid_start="")
        names = []
        for gpu in gpus:
            claim = Claim(
                gpu=gpu, project=project, since=time.time(), container=container, run=run, **me
            )
            name = f"{CLAIM_PREFIX}{_safe(gpu)}.{me['uid']}.{os.urandom(6).hex()}.json"
            names.append(self._write(name, asdict(claim), held=True))
        return names

    def transfer(self, names: Sequence[str], container: str, run: str = "") -> list[str]:
        """Our claims `names` made a detached run's (call under `locked`): new claims that
        name `container`, held by this process until a keeper inherits them
        (`held_descriptors`, then `forget`), are written before the old ones go."""
        gpus: list[str] = []
        project = ""
        for name in names:
            read = self._read(name)
            if read is not None and read[1].st_uid == os.getuid() and name in self._held:
                gpus.append(str(read[0].get("gpu")))
                project = str(read[0].get("project") or "")
        handed = self._add(gpus, project, container, run)
        for name in names:
            self._delete(name)
        self._reread_job_map()
        return handed

    def held_descriptors(self, names: Sequence[str]) -> list[int]:
        """The locked descriptors of our claims `names`: a process that inherits them
        holds the claims (an open file description's lock is shared with it)."""
        return [self._held[name] for name in names if name in self._held]

    def forget(self, names: Sequence[str]) -> None:
        """Let go of our copies of claims another process now holds (its keeper): the
        files stay, and count while that process lives."""
        for name in names:
            fd = self._held.pop(name, None)
            if fd is not None:
                os.close(fd)

    def read_record(self, name: str, owners: Sequence[int]) -> dict[str, Any] | None:
        """A JSON record of the folder, if one of `owners` wrote it."""
        read = self._read(name)
        if read is None or read[1].st_uid not in owners:
            return None
        return read[0]

    def write_record(self, name: str, data: Mapping[str, object]) -> None:
        """Replace our own record `name` (atomically: a new file renamed over it). One
        planted under that name by someone else stays: the record is then not kept."""
        try:
            self._write(name, data, held=False)
        except PermissionError:
            self.problems.append(f"{os.path.join(self.directory, name)} is not ours: not kept")

    def release(self, names: Sequence[str]) -> None:
        for name in names:
            self._delete(name)
        if any(name.startswith(CLAIM_PREFIX) for name in names):
            self._reread_job_map()

    def _reread_job_map(self) -> None:
        """After our claims changed: the mapping from the claims as they are now."""
        if self.job_map is not None:
            self.claims()

    # -- the queue ------------------------------------------------------------------------

    def enqueue(self) -> str:
        me = _me()
        name = f"{TICKET_PREFIX}{time.time():017.6f}.{me['uid']}.{os.urandom(6).hex()}.json"
        return self._write(name, {**me, "since": time.time()}, held=True)

    def waiters(self, before: str | None = None) -> list[Waiter]:
        """Live waiters queued before ticket `before` (all of them without it). A ticket
        counts while its process holds it (a lock, as for claims) and keeps it fresh."""
        out = []
        me = os.getuid()
        for name in self._names(TICKET_PREFIX):
            if name == before:
                break
            read = self._read(name)
            if read is None:
                continue
            data, info, held = read
            if not self._consistent(name, data, info):
                continue
            try:
                pid = _number(data, "pid")
                local = _text(data, "host") == self.hostname
            except ValueError as exc:
                self._problem(name, info, f"is not a gpuenv queue ticket ({exc})")
                continue
            fresh = self._fresh(info, TICKET_EXPIRY)
            if (local and fresh and held) or (not local and fresh and self.folder.between_hosts):
                out.append(Waiter(owner_name(info.st_uid), pid, info.st_mtime))
            elif local and (info.st_uid == me or me == 0):
                self._delete(name)
        return out

    def tickets_before(self, ticket: str) -> bool:
        """Whether any queue ticket was taken before `ticket`, by its name alone (no
        lock, nothing read: whether it is live is `waiters`' to tell)."""
        return any(name < ticket for name in self._names(TICKET_PREFIX))

    def waiting(self) -> list[Waiter]:
        """Whoever is queued: a new request then queues behind them."""
        return self.waiters()

    def first_in_queue(self, ticket: str) -> bool:
        """Whether no live waiter queued before `ticket` (first come, first served)."""
        return not self.waiters(ticket)


def _me() -> dict[str, Any]:
    uid = os.getuid()
    pid = os.getpid()
    return {
        "user": owner_name(uid),
        "uid": uid,
        "pid": pid,
        "pid_start": process_start(pid),
        "host": socket.gethostname(),
    }
