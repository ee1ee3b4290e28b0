"""GPU reservations on one shared host: claims that never collide.

Check and claim happen under one file lock, and the claim is on disk before the lock is
released, so two runs can never take the same GPU. Claims live in a shared state folder
(sticky, like /tmp: any user adds claims, nobody removes another user's). A claim names
its gpuenv process; when that process is gone, the claim no longer counts, whoever's it
was, and its owner's next command deletes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import socket
import stat
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gpuenv.errors import UsageError
from gpuenv.sharing.procfs import process_start

STATE_ENV = "GPUENV_STATE_DIR"
DEFAULT_STATE_DIR = "/var/tmp/gpuenv"


@dataclass(frozen=True)
class Claim:
    gpu: str  # the GPU's UUID, or its index where UUIDs are unknown
    user: str
    uid: int
    pid: int
    pid_start: str
    host: str
    project: str
    since: float
    container: str = ""

    def describe(self) -> str:
        held = time.strftime("%H:%M", time.localtime(self.since))
        return f"{self.user} ({self.project}, pid {self.pid}, since {held})"


def state_dir(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get(STATE_ENV) or DEFAULT_STATE_DIR


def _shared_folder(path: str) -> None:
    """Make a folder every user can add to but nobody can clean out for others (1777)."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"cannot create the gpuenv state folder {path}: {exc.strerror}",
            hint=f"create it once with `sudo install -d -m 1777 {path}`, or set {STATE_ENV}",
        ) from None
    info = os.stat(path)
    if info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) != 0o1777:
        with contextlib.suppress(OSError):
            os.chmod(path, 0o1777)


def alive(claim: Claim) -> bool:
    """A claim counts while its gpuenv process (the same one: start time) lives here."""
    if claim.host != socket.gethostname():
        return True  # another machine sharing the folder: trust it
    start = process_start(claim.pid)
    return bool(start) and start == claim.pid_start


class ClaimStore:
    def __init__(self, directory: str | None = None) -> None:
        self.directory = directory or state_dir()
        self.claims_dir = os.path.join(self.directory, "claims")
        self.queue_dir = os.path.join(self.directory, "queue")
        for folder in (self.directory, self.claims_dir, self.queue_dir):
            _shared_folder(folder)
        self.lock_path = os.path.join(self.directory, "claims.lock")

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The one lock around check-and-claim (flock: released if the process dies)."""
        try:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        except PermissionError:
            fd = os.open(self.lock_path, os.O_RDONLY)
        with contextlib.suppress(OSError):
            if os.fstat(fd).st_uid == os.getuid():
                os.fchmod(fd, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def _files(self, folder: str) -> list[str]:
        try:
            return sorted(
                os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".json")
            )
        except OSError:
            return []

    def claims(self) -> list[Claim]:
        """Every live claim; dead ones of this user are deleted on the way."""
        out = []
        for path in self._files(self.claims_dir):
            try:
                with open(path, encoding="utf-8") as handle:
                    claim = Claim(**json.load(handle))
            except (OSError, ValueError, TypeError):
                continue
            if alive(claim):
                out.append(claim)
            elif claim.uid == os.getuid() or os.getuid() == 0:
                with contextlib.suppress(OSError):
                    os.unlink(path)
        return out

    def _write(self, folder: str, name: str, data: dict[str, object]) -> str:
        path = os.path.join(folder, name)
        temp = f"{path}.tmp"
        with open(temp, "w", encoding="utf-8") as handle:
            json.dump(data, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, 0o644)
        os.replace(temp, path)
        return path

    def add(self, gpus: Sequence[str], project: str) -> list[str]:
        """Record claims (call under `locked`); returns their files, for `release`."""
        me = _me()
        paths = []
        for gpu in gpus:
            claim = Claim(gpu=gpu, project=project, since=time.time(), **me)
            safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in gpu)
            name = f"{safe}.{me['uid']}.{me['pid']}.json"
            paths.append(self._write(self.claims_dir, name, asdict(claim)))
        return paths

    def release(self, paths: Sequence[str]) -> None:
        for path in paths:
            with contextlib.suppress(OSError):
                os.unlink(path)

    def enqueue(self) -> str:
        me = _me()
        name = f"{time.time():017.6f}.{me['uid']}.{me['pid']}.json"
        return self._write(self.queue_dir, name, me)

    def waiting(self) -> bool:
        """Whether anyone is queued: a new request then queues behind them."""
        return not self.first_in_queue("")

    def first_in_queue(self, ticket: str) -> bool:
        """Whether no live waiter queued before `ticket` (first come, first served)."""
        for path in self._files(self.queue_dir):
            if path == ticket:
                return True
            try:
                with open(path, encoding="utf-8") as handle:
                    data = json.load(handle)
                waiting = alive(
                    Claim(
                        "",
                        data["user"],
                        data["uid"],
                        data["pid"],
                        data["pid_start"],
                        data["host"],
                        "",
                        0,
                    )
                )
            except (OSError, ValueError, TypeError, KeyError):
                continue
            if waiting:
                return False
            if data.get("uid") == os.getuid() or os.getuid() == 0:
                with contextlib.suppress(OSError):
                    os.unlink(path)
        return True


def _me() -> dict[str, Any]:
    uid = os.getuid()
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = os.environ.get("USER") or str(uid)
    pid = os.getpid()
    return {
        "user": user,
        "uid": uid,
        "pid": pid,
        "pid_start": process_start(pid),
        "host": socket.gethostname(),
    }
