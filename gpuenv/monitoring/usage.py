"""GPU-hours: every run leaves usage records, and `gpuenv usage` adds them up.

A run appends a start record when it has its GPUs and an end record when it ends, to its
user's own file in the state folder (`usage/<uid>.jsonl`, owned by that uid, mode 0600:
the user and root read it). Appends are one line each, under flock (one writer at a
time, with a timeout), fsync'd before the lock is released; a line torn by a crash is
skipped when read. A run whose gpuenv process was killed gets its end from whoever
removes its container next (`reap_orphans`, `gpuenv rm`) where that is the owner or
root. What is trusted, and how the files are opened: `usage_files`.
"""

from __future__ import annotations

import calendar
import contextlib
import json
import math
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from gpuenv.common import nesting
from gpuenv.errors import UsageError
from gpuenv.host.procfs import process_start
from gpuenv.monitoring import usage_files as files
from gpuenv.reservations.statedir import open_state, owner_name

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


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _valid_id(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= 32 and value.isascii() and value.isalnum()


class UsageLog:
    """The usage records of one host's state folder."""

    def __init__(self, state_directory: str, timeout: float = LOCK_TIMEOUT) -> None:
        self.state_directory = state_directory
        self.directory = usage_dir(state_directory)
        self.timeout = timeout

    @contextlib.contextmanager
    def _usage(self, *, create: bool) -> Iterator[int | None]:
        """The usage folder's descriptor (None: there is none yet and not `create`d)."""
        folder = open_state(directory=self.state_directory)
        try:
            fd = files.open_dir(folder.fd, "usage", self.directory, folder.owner, create=create)
            try:
                yield fd
            finally:
                if fd is not None:
                    os.close(fd)
        finally:
            folder.close()

    def _append(self, record: Mapping[str, Any], owner: int) -> None:
        with self._usage(create=True) as fd:
            assert fd is not None
            name = f"{owner}.jsonl"
            where = os.path.join(self.directory, name)
            files.append(fd, name, record, owner, where, self.timeout)

    def begin(
        self,
        project: str,
        gpus: Sequence[tuple[str, str]],
        start: float | None = None,
        *,
        detached: bool = False,
    ) -> str:
        """Record a run's start (its GPUs granted); returns its usage id for `finish`.
        A detached run counts as running until its end is recorded (by the reaper or
        `gpuenv rm`): its gpuenv process exits right after starting it."""
        run_id = os.urandom(8).hex()  # as uuid4's first 16 hex digits, without uuid's import
        pid = os.getpid()
        record = {
            "event": "start",
            "id": run_id,
            "user": owner_name(os.getuid()),
            "uid": os.getuid(),
            "project": project,
            "start": time.time() if start is None else start,
            "gpus": [{"key": key, "model": model} for key, model in gpus],
            "host": os.uname().nodename,
            "pid": pid,
            "pid_start": process_start(pid),
        }
        if detached:
            record["detached"] = True
        self._append(record, os.getuid())
        return run_id

    def finish(self, run_id: str, exit_code: int | None, end: float | None = None) -> None:
        record = {"event": "end", "id": run_id, "end": time.time() if end is None else end}
        record["exit"] = exit_code
        self._append(record, os.getuid())

    def finish_for(self, label: str, exit_code: int | None, end: float | None = None) -> None:
        """Another process's run ended (its container was reaped or removed; `label` is
        its USAGE_LABEL, "<uid>/<id>"): the end record goes to the owner's file, once,
        when we may write it (the owner, root). Another user's record of it would not be
        believed, so none is written: such a run stays unrecorded."""
        owner_text, _, run_id = label.partition("/")
        if not (owner_text.isascii() and owner_text.isdigit()) or not _valid_id(run_id):
            return
        owner = int(owner_text)
        if os.getuid() not in (0, owner):
            return
        if any(run.id == run_id and run.end is not None for run in self.runs(owner)):
            return  # a detached run's end is seen by every command until it is removed
        record = {"event": "end", "id": run_id, "end": time.time() if end is None else end}
        record["exit"] = exit_code
        self._append(record, owner)

    def runs(self, uid: int | None = None) -> list[UsageRun]:
        """The runs in the records `uid` may read: root (uid 0) all, a user their own.
        Only `<uid>.jsonl` files owned by that uid are read, and in them only records of
        that uid; an end marker counts only when root or the run's owner made it."""
        uid = os.getuid() if uid is None else uid
        found: list[UsageRun] = []
        with self._usage(create=False) as fd:
            if fd is None:
                return []
            ended = files.open_dir(
                fd,
                "ended",
                os.path.join(self.directory, "ended"),
                os.fstat(fd).st_uid,
                create=False,
            )
            try:
                for owner, data in files.owner_files(fd, uid):
                    found.extend(_owner_runs(owner, files.records(data), ended))
            finally:
                if ended is not None:
                    os.close(ended)
        return found


@dataclass(frozen=True)
class Usage:
    """`gpuenv usage`'s answer: the rows, and how many runs still run or went unrecorded."""

    rows: list[UsageRow]
    running: int
    unrecorded: int


def usage_summary(
    log: UsageLog,
    by: str,
    since: float,
    now: float,
    prices: Mapping[str, float] | None = None,
    only: int | None = None,
) -> Usage:
    """The GPU-hours `log.runs()` would add up (`summarize`), from the SQLite index of
    the records (`usage_index`): ended runs summed in SQL, the few without an end judged
    here. `only`: one owner's runs. Without an index (no cache folder), the records are
    read whole, as `runs` reads them."""
    from gpuenv.monitoring import usage_index

    with log._usage(create=False) as fd:
        if fd is None:
            return Usage([], 0, 0)
        with usage_index.opened(log.state_directory) as db:
            if db is None:
                runs = [r for r in log.runs() if only is None or r.uid == only]
                return _usage(summarize(runs, by, since, now, prices), runs)
            for owner, name in files.owner_names(fd, os.getuid()):
                usage_index.refresh(db, fd, owner, name)
            opened = _open_runs(fd, usage_index.open_starts(db, only))
            rows = _ended_rows(db, by, since, now, only)
    for row in summarize(opened, by, since, now, None):
        _merge(rows.setdefault(row.key, UsageRow(row.key)), row)
    for row in rows.values():
        if prices is not None and all(model in prices for model in row.by_model):
            row.cost = sum(hours * prices[model] for model, hours in row.by_model.items())
    return _usage(sorted(rows.values(), key=lambda r: (-r.gpu_hours, r.key)), opened)


def _usage(rows: list[UsageRow], runs: Sequence[UsageRun]) -> Usage:
    running = sum(1 for r in runs if r.state == "running")
    return Usage(rows, running, sum(1 for r in runs if r.state == "unrecorded"))


def _ended_rows(
    db: Any, by: str, since: float, now: float, only: int | None
) -> dict[str, UsageRow]:
    """The rows of the runs with a recorded end, from the index's sums."""
    from gpuenv.monitoring import usage_index

    def shown(key: Any) -> str:
        return owner_name(key) if by == "user" else str(key)

    rows: dict[str, UsageRow] = {}
    for key, model, runs, hours in usage_index.ended_sums(db, by, since, now, only):
        row = rows.setdefault(shown(key), UsageRow(shown(key)))
        row.gpu_hours += hours
        row.by_model[model] = row.by_model.get(model, 0.0) + hours
        row.runs += runs if by == "gpu" else 0
    for key, runs in usage_index.ended_runs_by_key(db, by, since, only):
        rows.setdefault(shown(key), UsageRow(shown(key))).runs += runs
    return rows


def _merge(into: UsageRow, row: UsageRow) -> None:
    into.runs += row.runs
    into.gpu_hours += row.gpu_hours
    for model, hours in row.by_model.items():
        into.by_model[model] = into.by_model.get(model, 0.0) + hours


def _open_runs(fd: int, starts: Iterator[tuple[int, str, str, str | None]]) -> list[UsageRun]:
    """The runs without a usable end record, judged now (an end marker of the reaper's,
    running, or unrecorded), as `runs` judges them."""
    ended = files.open_dir(
        fd, "ended", os.path.join("usage", "ended"), os.fstat(fd).st_uid, create=False
    )
    out = []
    try:
        for owner, run_id, start, end in starts:
            record = nesting.loads(json.loads, start)
            finish = nesting.loads(json.loads, end) if end else None
            run = _run(owner, record, finish or _marker(ended, run_id, owner))
            if run is not None:
                out.append(run)
    finally:
        if ended is not None:
            os.close(ended)
    return out


def _owner_runs(
    owner: int, lines: Iterator[dict[str, Any]], ended: int | None
) -> Iterator[UsageRun]:
    starts: dict[str, dict[str, Any]] = {}
    ends: dict[str, dict[str, Any]] = {}
    for line in lines:
        if not _valid_id(line.get("id")):
            continue
        if line.get("event") == "start" and line.get("uid") == owner:
            starts.setdefault(line["id"], line)
        elif line.get("event") == "end":
            ends.setdefault(line["id"], line)
    for run_id, start in starts.items():
        run = _run(owner, start, ends.get(run_id) or _marker(ended, run_id, owner))
        if run is not None:
            yield run


def _marker(ended: int | None, run_id: str, owner: int) -> dict[str, Any] | None:
    if ended is None:
        return None
    found = files.read_owned(ended, f"{run_id}.json", files.MAX_MARKER)
    if found is None or found[0] not in (0, owner):
        return None  # anyone may add files there: only root's or the owner's count
    try:
        data = nesting.loads(json.loads, found[1])
    except ValueError:
        return None
    return data if isinstance(data, dict) and data.get("id") == run_id else None


def _run(owner: int, start: dict[str, Any], end: dict[str, Any] | None) -> UsageRun | None:
    """The run its records tell, None when the start record is malformed."""
    began, gpus = _number(start.get("start")), start.get("gpus", [])
    project = start.get("project", "?")
    if began is None or not isinstance(gpus, list) or not isinstance(project, str):
        return None
    if not all(isinstance(g, dict) for g in gpus):
        return None
    base = UsageRun(
        id=start["id"],
        user=owner_name(owner),
        uid=owner,
        project=project,
        start=began,
        gpus=tuple((str(g.get("key", "?")), str(g.get("model") or "unknown")) for g in gpus),
    )
    finished = None if end is None else _number(end.get("end"))
    if end is not None and finished is not None:
        code = end.get("exit")
        exit_code = code if isinstance(code, int) and not isinstance(code, bool) else None
        return replace(base, end=finished, exit=exit_code, state="ended")
    if start.get("detached") is True:
        return replace(base, state="running")  # until the reaper or `gpuenv rm` ends it
    local = start.get("host") == os.uname().nodename
    pid = start.get("pid")
    valid_pid = isinstance(pid, int) and not isinstance(pid, bool) and pid > 0
    pid_start = process_start(pid) if valid_pid else None  # type: ignore[arg-type]
    if not local or (pid_start and pid_start == start.get("pid_start")):
        return replace(base, state="running")
    return replace(base, state="unrecorded")


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
    env = os.environ if env is None else env
    path = env.get(HOST_CONFIG_ENV) or DEFAULT_HOST_CONFIG
    try:
        with open(path, encoding="utf-8") as handle:
            data = nesting.loads(yaml.safe_load, handle.read()) or {}
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
