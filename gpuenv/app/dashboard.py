"""What `gpuenv dashboard` shows, as data (each payload has a schema in gpuenv/schemas):
the GPUs with their readings, health and holders, the wait queue and detached runs
(`gpus`), a GPU's history (`history`), and GPU-hours per user and project (`usage`).

A viewer sees what `ps` and `usage` show the user the dashboard runs as; never a command
line, an environment value or a process ID.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from gpuenv.app.sampler import HistorySettings, Sampler, detect_sampled
from gpuenv.app.top import Shared, read_runs, read_shared
from gpuenv.common import nesting
from gpuenv.common.versions import as_written
from gpuenv.containers.sizing import (
    SizingSettings,
    disk_finding,
    memory_finding,
    storage_finding,
    storage_kind,
    system_memory_mib,
)
from gpuenv.engine.protocol import Engine
from gpuenv.errors import GpuenvError, StateUnsafe
from gpuenv.host.detect import detect_host
from gpuenv.host.machine import Gpu, Host
from gpuenv.host.nvml import NvmlListener
from gpuenv.host.procfs import loopback_peer
from gpuenv.monitoring.fitness import unfit_gpus
from gpuenv.monitoring.health import assess
from gpuenv.monitoring.history import READINGS, RECENT_XIDS, History, SamplerBusy, history_folder
from gpuenv.monitoring.idle import idle_for
from gpuenv.monitoring.metrics import CLOCK_EVENT_REASONS
from gpuenv.monitoring.monitor import RunInfo, process_user
from gpuenv.monitoring.usage import UsageLog, load_prices, usage_summary
from gpuenv.reservations.claims import Claim
from gpuenv.reservations.statedir import Folder, open_state, owner_name, state_dir

WINDOWS = {"1h": 3600.0, "1d": 86400.0}
USAGE_DAYS = (7, 30)


class HistorySource(Protocol):
    name: str

    def series(
        self, key: str, since: float, readings: Sequence[str] = READINGS
    ) -> list[dict[str, Any]]: ...

    def xids(self, since: float) -> list[dict[str, Any]]: ...


class SqliteHistory:
    """The history database the sampler writes (root's, else the viewer's own)."""

    def __init__(self, open_history: Callable[[], History | None], where: str) -> None:
        self.open_history = open_history
        self.name = f"sqlite:{where}"

    def series(
        self, key: str, since: float, readings: Sequence[str] = READINGS
    ) -> list[dict[str, Any]]:
        history = self.open_history()
        if history is None:
            return []
        try:
            return history.series(key, since)
        finally:
            history.close()

    def xids(self, since: float) -> list[dict[str, Any]]:
        history = self.open_history()
        if history is None:
            return []
        try:
            return [xid.to_data() for xid in history.xids(since)]
        finally:
            history.close()


def open_history(settings: HistorySettings) -> tuple[SqliteHistory | None, str, Sampler | None]:
    """This user's history in the state folder, who samples into it (for the page) and
    the sampler this process runs (None where another process of theirs samples; it
    owns its NVML session, started): never a reason not to serve the live page."""
    folder = open_state()
    where = os.path.join(folder.path, history_folder(os.getuid()))
    try:
        history = History.for_sampling(folder, settings.max_mib)
    except SamplerBusy:
        return _reader(folder, where), f"another process of {owner_name(os.getuid())}'s", None
    except StateUnsafe as exc:
        return None, f"none: {exc.message}", None
    listener = NvmlListener()
    listener.start()
    sampler = Sampler(history, settings, detect_sampled, listener, owns_listener=True)
    return _reader(folder, where), "this dashboard", sampler


def _reader(folder: Folder, where: str) -> SqliteHistory:
    def open_reading() -> History | None:
        return History.for_reading(folder)

    return SqliteHistory(open_reading, where)


# gpuenv exporter's series behind each reading, and the factor to the reading's unit.
PROMETHEUS_SERIES = {
    "utilization": ("gpuenv_gpu_utilization_ratio", 100),
    "memory_used_mib": ("gpuenv_gpu_memory_used_bytes", 1 / 2**20),
    "memory_total_mib": ("gpuenv_gpu_memory_total_bytes", 1 / 2**20),
    "temperature_c": ("gpuenv_gpu_temperature_celsius", 1),
    "power_w": ("gpuenv_gpu_power_watts", 1),
    "power_limit_w": ("gpuenv_gpu_power_limit_watts", 1),
    "sm_clock_mhz": ("gpuenv_gpu_sm_clock_hertz", 1e-6),
}


class PrometheusHistory:
    """History from a Prometheus that scrapes `gpuenv exporter` (query_range)."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.name = f"prometheus:{self.url}"

    def _query_range(self, promql: str, since: float, now: float) -> list[Any]:
        step = max(15, int((now - since) / 240))
        query = urllib.parse.urlencode(
            {"query": promql, "start": since, "end": now, "step": f"{step}s"}
        )
        with urllib.request.urlopen(
            f"{self.url}/api/v1/query_range?{query}", timeout=self.timeout
        ) as response:
            body = nesting.loads(json.loads, response.read(8 * 2**20))
        result = body.get("data", {}).get("result", [])
        return result[0]["values"] if result else []

    def series(
        self, key: str, since: float, readings: Sequence[str] = READINGS
    ) -> list[dict[str, Any]]:
        """The readings asked for (each one query), keyed like gpuenv exporter's labels:
        a UUID (GPU- or MIG-) by `uuid`, an index by `gpu`."""
        now = time.time()
        label = "uuid" if key.startswith(("GPU-", "MIG-")) else "gpu"
        selector = f'{label}="{_promql_string(key)}"'
        points: dict[float, dict[str, Any]] = {}
        for reading in readings:
            metric, factor = PROMETHEUS_SERIES[reading]
            promql = f"max({metric}{{{selector}}}) * {factor}"
            for t, value in self._query_range(promql, since, now):
                point = points.setdefault(float(t), {"t": float(t)} | dict.fromkeys(READINGS))
                point[reading] = round(float(value), 2)
        return [points[t] for t in sorted(points)]

    def xids(self, since: float) -> list[dict[str, Any]]:
        return []  # counters without times: the page shows the sampler's XIDs only


def _promql_string(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def reasons(mask: int | None) -> list[str]:
    """NVML's clock event reason bits by name.

    >>> reasons(0x24)
    ['sw_power_cap', 'sw_thermal_slowdown']
    """
    return [name for name, bit in CLOCK_EVENT_REASONS if mask and mask & bit]


def _holder(
    gpu_key: str, claims: Sequence[Claim], runs: Sequence[RunInfo], idle: dict[str, Any]
) -> dict[str, Any] | None:
    claim = next((c for c in claims if c.gpu == gpu_key), None)
    if claim is None:
        return None
    run = next(
        (r for r in runs if (claim.container in (r.id, r.name)) or r.pid == claim.pid),
        None,
    )
    return {
        "user": claim.user,
        "project": claim.project,
        "run": run.name if run else None,
        "detached": bool(claim.container),
        "since": claim.since,
        "idle_seconds": idle_for(idle, gpu_key, time.time()),
        # where the run is reached (`-p`, the spec's ports): the host side -> the container
        "ports": [f"{p.address}:{p.host}→{p.container}" for p in run.ports] if run else [],
    }


def _gpu(
    gpu: Gpu, shared: Shared, runs: Sequence[RunInfo], xids: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    by_container = {run.id: run for run in runs}
    return {
        "index": gpu.index,
        "name": gpu.name,
        "uuid": gpu.uuid,
        "key": gpu.key,
        "utilization": gpu.utilization,
        "memory_used_mib": gpu.memory_used_mib,
        "memory_total_mib": gpu.memory_total_mib,
        "temperature_c": gpu.temperature_c,
        "slowdown_temperature_c": gpu.slowdown_temperature_c,
        "power_w": gpu.power_w,
        "power_limit_w": gpu.power_limit_w,
        "sm_clock_mhz": gpu.sm_clock_mhz,
        "sm_clock_max_mhz": gpu.sm_clock_max_mhz,
        "clocks_event_reasons": reasons(gpu.clocks_event_reasons),
        "lost": gpu.lost,
        "health": [
            {"severity": f.severity, "kind": f.kind, "message": f.message, "remedy": f.remedy}
            for f in assess(gpu)
        ],
        "holder": _holder(gpu.key, shared.claims, runs, shared.idle),
        "users": _users(gpu, by_container),
        "recent_xids": [x for x in xids if x["gpu"] == gpu.key],
        "mig": [
            {
                "index": mig.index,
                "uuid": mig.uuid,
                "profile": mig.profile,
                "memory_total_mib": mig.memory_total_mib,
                "holder": _holder(mig.uuid, shared.claims, runs, shared.idle),
            }
            for mig in gpu.mig_devices
        ],
    }


def _users(gpu: Gpu, by_container: dict[str, RunInfo]) -> list[dict[str, Any]]:
    """Who has processes on the GPU, as `top` names them (gpuenv runs by name, others by
    their user), without process IDs or containers: the page is for people."""
    return [
        {key: user.get(key) for key in ("run", "project", "user")}
        for user in (process_user(process, by_container) for process in gpu.processes)
    ]


def sizing_payload(engine: Callable[[], Engine], host: Host) -> list[dict[str, str]]:
    """`doctor`'s right-sizing checks, for the page: system memory against GPU memory,
    and where the engine answers, its data root's storage and free space."""
    try:
        settings = SizingSettings.load()
    except GpuenvError as exc:
        return [{"check": "sizing settings", "status": "fail", "detail": exc.message, "remedy": ""}]
    found: list[tuple[str, tuple[str, str, str]]] = []
    memory = memory_finding(system_memory_mib(), host.gpus, settings)
    if memory is not None:
        found.append(("system memory", memory))
    try:
        info = engine().info()
    except GpuenvError:
        info = None
    if info is not None:
        root = str(info.get("DockerRootDir") or info.get("GraphRoot") or "/var/lib/docker")
        found.append(("storage", storage_finding(root, storage_kind(root))))
        found.append(("disk", disk_finding(root, 0, settings)))
    return [
        {"check": name, "status": status, "detail": detail, "remedy": remedy}
        for name, (status, detail, remedy) in found
    ]


class SizingChecks:
    """`sizing_payload`, read at most once per `every` seconds (it changes slowly)."""

    def __init__(self, engine: Callable[[], Engine], every: float = 60.0) -> None:
        self.engine = engine
        self.every = every
        self._read: tuple[float, list[dict[str, str]]] = (0.0, [])

    def __call__(self, host: Host) -> list[dict[str, str]]:
        read_at, found = self._read
        if not read_at or time.monotonic() - read_at > self.every:
            found = sizing_payload(self.engine, host)
            self._read = (time.monotonic(), found)
        return found


def gpus_payload(
    engine: Callable[[], Engine],
    history: HistorySource | None,
    status: dict[str, Any],
    sizing: Callable[[Host], list[dict[str, str]]] | None = None,
) -> dict[str, Any]:
    """The live page: never without its GPUs because the history cannot be read (that
    is said in `history.note`). `status`: who samples, their last note and sample."""
    host: Host = detect_host()
    shared = read_shared(engine) if host.gpus else Shared([], [], {})
    engine_notes: list[str] = []
    runs = read_runs(engine, engine_notes) if host.gpus else []
    try:
        unfit = unfit_gpus(host)
    except GpuenvError:  # a config the admin must fix: the page still shows the GPUs
        unfit = {}
    note = status.get("note")
    try:
        xids = history.xids(time.time() - RECENT_XIDS) if history else []
    except (GpuenvError, sqlite3.Error, OSError) as exc:
        xids = []
        note = f"the history cannot be read: {exc.message if isinstance(exc, GpuenvError) else exc}"
    return {
        "hostname": socket.gethostname(),
        "generated": time.time(),
        "engine_note": engine_notes[0] if engine_notes else None,
        "host": {
            "driver": as_written(host.driver),
            "cuda_driver": host.cuda_driver,
            "source": host.source,
            "note": host.note,
        },
        "gpus": [
            {**_gpu(gpu, shared, runs, xids), "unfit": unfit.get(gpu.key)} for gpu in host.gpus
        ],
        "queue": [{"user": w.user, "since": w.since} for w in shared.waiters],
        "detached": [
            {
                "name": r.name,
                "user": r.user,
                "project": r.project,
                "gpus": r.gpus,
                "started": r.started,
            }
            for r in runs
            if r.detached
        ],
        "history": {
            "source": history.name if history else None,
            "sampler": status.get("sampler", ""),
            "note": note,
            "last_sample": status.get("last_sample"),
        },
        "sizing": sizing(host) if sizing else [],
    }


def history_payload(
    history: HistorySource | None, key: str, window: str, readings: Sequence[str] = READINGS
) -> dict[str, Any]:
    since = time.time() - WINDOWS[window]
    return {
        "gpu": key,
        "window": window,
        "source": history.name if history else None,
        "points": history.series(key, since, readings) if history else [],
    }


def viewer_uid(client: tuple[str, int], server: tuple[str, int]) -> int | None:
    """Whose process holds the client end of a loopback connection from `client` to
    `server` (/proc/net/tcp); None when it cannot be told."""
    return loopback_peer(client, server)


def usage_payload(viewer: int | None, now: float | None = None) -> dict[str, Any]:
    """GPU-hours (and cost, where prices are configured) per user and per project for
    the last 7 and 30 days, as `gpuenv usage` shows them to `viewer`: root every user's,
    a user their own (-1: a viewer who cannot be told, nobody's). None: everything the
    dashboard's own user may read (a token holder)."""
    now = time.time() if now is None else now
    prices = load_prices()
    log = UsageLog(state_dir())
    only = viewer if viewer is not None and viewer != 0 else None
    per_gpu_hour = prices.per_gpu_hour if prices else None

    def rows(by: str, days: int) -> list[dict[str, Any]]:
        found = usage_summary(log, by, now - days * 86400, now, per_gpu_hour, only).rows
        return [row.to_data() for row in found]

    return {
        "viewer": None if viewer is None or viewer < 0 else owner_name(viewer),
        "currency": prices.currency if prices else None,
        "periods": [
            {"days": days, "by_user": rows("user", days), "by_project": rows("project", days)}
            for days in USAGE_DAYS
        ],
    }
