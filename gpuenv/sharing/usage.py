"""GPU-hours: every run leaves usage records, and `gpuenv usage` adds them up.

A run appends a start record when it has its GPUs and an end record when it ends, to its
user's own file in the state folder (`usage/<uid>.jsonl`, mode 0600: the user and root
read it). Appends are one line each, under flock (one writer at a time, with a timeout),
fsync'd before the lock is released; a line torn by a crash is skipped when read. A run
whose gpuenv process was killed gets its end from whoever removes its container next
(`reap_orphans`): into the owner's file where that is allowed, else as a small
world-readable marker (`usage/ended/<id>.json`: the run id, the end, the exit code).

The detached runs of another change call `begin` and `finish` the same way.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuenv.errors import UsageError
from gpuenv.sharing.procfs import process_start

LOCK_TIMEOUT = 10.0  # seconds to wait for another writer


@dataclass(frozen=True)
class UsageRun:
    """One run as its records tell it; `end` None while it runs or when never recorded."""

    id: str
    user: str
    uid: int
    project: str
    start: float
    gpus: tuple[tuple[str, str], ...]  # (key, model)
    end: float | None = None
    exit: int | None = None
    state: str = "ended"  # ended | running | unrecorded

    def hours(self, since: float, now: float) -> float:
        """Hours of one of its GPUs inside [since, now] (a running one counts until now)."""
        end = now if self.end is None and self.state == "running" else self.end
        if end is None:
            return 0.0
        return max(0.0, min(end, now) - max(self.start, since)) / 3600


def usage_dir(state_directory: str) -> str:
    return os.path.join(state_directory, "usage")


def _folder(path: str, mode: int) -> None:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create the usage folder {path}: {exc.strerror}") from None
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise UsageError(f"{path} is not a folder: gpuenv keeps GPU usage records there")
    if info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) != mode:
        with contextlib.suppress(OSError):
            os.chmod(path, mode)


@contextlib.contextmanager
def _locked(fd: int, path: str, timeout: float) -> Iterator[None]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise UsageError(
                    f"{path} stayed locked by another gpuenv for {timeout:g}s: usage not recorded"
                ) from None
            time.sleep(0.05)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def append(path: str, record: Mapping[str, Any], owner: int, timeout: float = LOCK_TIMEOUT) -> None:
    """One record as one line, fsync'd, in `owner`'s file (root creates it for them)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        raise UsageError(f"cannot write usage records to {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid not in (owner, os.getuid()):
            raise UsageError(f"{path} is not {owner}'s usage file: not writing to it")
        if info.st_uid != owner and os.getuid() == 0:
            os.fchown(fd, owner, -1)
        with _locked(fd, path, timeout):
            os.write(fd, (json.dumps(record, sort_keys=True) + "\n").encode())
            os.fsync(fd)
    finally:
        os.close(fd)


class UsageLog:
    """The usage records of one host's state folder."""

    def __init__(self, state_directory: str) -> None:
        self.directory = usage_dir(state_directory)
        self.ended_dir = os.path.join(self.directory, "ended")

    def _file(self, uid: int) -> str:
        return os.path.join(self.directory, f"{uid}.jsonl")

    def _prepare(self) -> None:
        _folder(self.directory, 0o1777)
        _folder(self.ended_dir, 0o1777)

    def begin(
        self, project: str, gpus: Sequence[tuple[str, str]], start: float | None = None
    ) -> str:
        """Record a run's start (its GPUs granted); returns its usage id for `finish`."""
        import pwd

        self._prepare()
        run_id = uuid.uuid4().hex[:16]
        pid = os.getpid()
        try:
            user = pwd.getpwuid(os.getuid()).pw_name
        except KeyError:
            user = str(os.getuid())
        record = {
            "event": "start",
            "id": run_id,
            "user": user,
            "uid": os.getuid(),
            "project": project,
            "start": time.time() if start is None else start,
            "gpus": [{"key": key, "model": model} for key, model in gpus],
            "host": os.uname().nodename,
            "pid": pid,
            "pid_start": process_start(pid),
        }
        append(self._file(os.getuid()), record, os.getuid())
        return run_id

    def finish(self, run_id: str, exit_code: int | None, end: float | None = None) -> None:
        self._prepare()
        record = {"event": "end", "id": run_id, "end": time.time() if end is None else end}
        record["exit"] = exit_code
        append(self._file(os.getuid()), record, os.getuid())

    def finish_for(self, label: str, exit_code: int | None, end: float | None = None) -> None:
        """Another process's run ended (its container was reaped; `label` is its
        USAGE_LABEL, "<uid>/<id>"): the end record goes to the owner's file when we may
        write it (the owner, root), else to a marker."""
        owner_text, _, run_id = label.partition("/")
        if not owner_text.isdigit() or not run_id.isalnum():
            return
        owner = int(owner_text)
        if owner == os.getuid() or os.getuid() == 0:
            if any(  # a detached run's end is seen by every command until it is removed
                r.get("event") == "end" and r.get("id") == run_id
                for r in _records(self._file(owner))
            ):
                return
            self._prepare()
            record = {"event": "end", "id": run_id, "end": time.time() if end is None else end}
            record["exit"] = exit_code
            append(self._file(owner), record, owner)
            return
        self._prepare()
        safe = "".join(ch for ch in run_id if ch.isalnum())[:32]
        marker = os.path.join(self.ended_dir, f"{safe}.json")
        data = {"id": safe, "end": time.time() if end is None else end, "exit": exit_code}
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with contextlib.suppress(FileExistsError):
            fd = os.open(marker, flags, 0o644)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(data, handle)
                handle.flush()
                os.fsync(handle.fileno())

    def runs(self, uid: int | None = None) -> list[UsageRun]:
        """The runs in the records `uid` may read: root (uid 0) all, a user their own."""
        uid = os.getuid() if uid is None else uid
        try:
            names = sorted(os.listdir(self.directory))
        except OSError:
            return []
        mine = f"{uid}.jsonl"
        files = [n for n in names if n.endswith(".jsonl") and (uid == 0 or n == mine)]
        starts: dict[str, dict[str, Any]] = {}
        ends: dict[str, dict[str, Any]] = {}
        for name in files:
            for record in _records(os.path.join(self.directory, name)):
                if record.get("event") == "start" and isinstance(record.get("id"), str):
                    starts[record["id"]] = record
                elif record.get("event") == "end" and isinstance(record.get("id"), str):
                    ends[record["id"]] = record
        return [
            _run(start, ends.get(run_id) or self._marker(run_id))
            for run_id, start in starts.items()
        ]

    def _marker(self, run_id: str) -> dict[str, Any] | None:
        path = os.path.join(self.ended_dir, f"{''.join(c for c in run_id if c.isalnum())}.json")
        try:
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None


def _records(path: str) -> Iterator[dict[str, Any]]:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line torn by a crash
        if isinstance(record, dict):
            yield record


def _run(start: dict[str, Any], end: dict[str, Any] | None) -> UsageRun:
    gpus = tuple(
        (str(g.get("key", "?")), str(g.get("model") or "unknown"))
        for g in start.get("gpus") or []
        if isinstance(g, dict)
    )
    base = UsageRun(
        id=start["id"],
        user=str(start.get("user", "?")),
        uid=int(start.get("uid", -1)),
        project=str(start.get("project", "?")),
        start=float(start.get("start", 0)),
        gpus=gpus,
    )
    if end is not None and isinstance(end.get("end"), int | float):
        exit_code = end.get("exit")
        return _replace(base, end=float(end["end"]), exit=exit_code, state="ended")
    local = start.get("host") == os.uname().nodename
    pid_start = process_start(int(start.get("pid", 0) or 0))
    if not local or (pid_start and pid_start == start.get("pid_start")):
        return _replace(base, state="running")
    return _replace(base, state="unrecorded")


def _replace(run: UsageRun, **changes: Any) -> UsageRun:
    from dataclasses import replace

    return replace(run, **changes)


@dataclass
class UsageRow:
    key: str
    runs: int = 0
    gpu_hours: float = 0.0
    cost: float | None = None
    by_model: dict[str, float] = field(default_factory=dict)

    def to_data(self) -> dict[str, Any]:
        data: dict[str, Any] = {"key": self.key, "runs": self.runs}
        data["gpu_hours"] = round(self.gpu_hours, 4)
        if self.cost is not None:
            data["cost"] = round(self.cost, 2)
        return data


def summarize(
    runs: Sequence[UsageRun],
    by: str,
    since: float,
    now: float,
    prices: Mapping[str, float] | None = None,
) -> list[UsageRow]:
    """GPU-hours per user, project or GPU model in [since, now]; with prices (per GPU
    model and hour) a cost, which stays unknown when a model has no price."""
    rows: dict[str, UsageRow] = {}
    for run in runs:
        if run.state == "unrecorded" or (run.end is not None and run.end < since):
            continue
        hours = run.hours(since, now)
        if by == "gpu":
            for model in dict.fromkeys(model for _, model in run.gpus):
                rows.setdefault(model, UsageRow(model)).runs += 1
            for _, model in run.gpus:
                row = rows[model]
                row.gpu_hours += hours
                row.by_model[model] = row.by_model.get(model, 0.0) + hours
            continue
        row = rows.setdefault(run.user if by == "user" else run.project, UsageRow(""))
        row.key = run.user if by == "user" else run.project
        row.runs += 1
        for _, model in run.gpus:
            row.gpu_hours += hours
            row.by_model[model] = row.by_model.get(model, 0.0) + hours
    for row in rows.values():
        if prices is not None and all(model in prices for model in row.by_model):
            row.cost = sum(hours * prices[model] for model, hours in row.by_model.items())
    return sorted(rows.values(), key=lambda r: (-r.gpu_hours, r.key))


def parse_since(text: str, now: float) -> float:
    """`7d`, `12h`, `30m`, `2w` before now, or a date `2026-11-01` (UTC)."""
    units = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
    if text[:-1].isdigit() and text[-1:] in units:
        return now - int(text[:-1]) * units[text[-1]]
    try:
        import calendar

        return float(calendar.timegm(time.strptime(text, "%Y-%m-%d")))
    except ValueError:
        raise UsageError(
            f"--since {text!r}: expected a duration (30m, 12h, 7d, 2w) or a date (2026-11-01)"
        ) from None


HOST_CONFIG_ENV = "GPUENV_HOST_CONFIG"
DEFAULT_HOST_CONFIG = "/etc/gpuenv/host.yaml"


@dataclass(frozen=True)
class Prices:
    currency: str
    per_gpu_hour: dict[str, float]


def load_prices(env: Mapping[str, str] | None = None) -> Prices | None:
    """The host config's prices per GPU model and hour (docs: sharing.md), None without
    a config file; a config that is there but wrong is a usage error naming the file."""
    import yaml

    env = os.environ if env is None else env
    path = env.get(HOST_CONFIG_ENV) or DEFAULT_HOST_CONFIG
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle) or {}
    except FileNotFoundError:
        if env.get(HOST_CONFIG_ENV):
            raise UsageError(f"{HOST_CONFIG_ENV}={path}: no such file") from None
        return None
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"{path}: cannot read the host config: {exc}") from None
    if not isinstance(data, dict) or set(data) - {"currency", "gpu_hour_prices"}:
        raise UsageError(f"{path}: expected the keys 'currency' and 'gpu_hour_prices' only")
    prices = data.get("gpu_hour_prices") or {}
    if not isinstance(prices, dict) or not all(
        isinstance(price, int | float) and not isinstance(price, bool) and price >= 0
        for price in prices.values()
    ):
        raise UsageError(
            f"{path}: 'gpu_hour_prices' must map GPU models (as NVML names them) to prices ≥ 0"
        )
    currency = data.get("currency", "")
    return Prices(str(currency), {str(model): float(price) for model, price in prices.items()})
