"""The dashboard's sampler: every `interval` seconds, this host's GPU readings and the
XID errors NVML reported since the last round go into the history database; rows older
than the retention go. Settings: `[history]` in /etc/gpuenv/config.toml."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpuenv.common.siteconfig import read_site_config, seconds
from gpuenv.errors import GpuenvError, UsageError
from gpuenv.host.hostfile import HOST_FILE_ENV, load_host_file
from gpuenv.host.machine import Host
from gpuenv.host.nvml import NvmlListener, detect_nvml
from gpuenv.monitoring.history import RECENT_XIDS, History, Xid


@dataclass(frozen=True)
class HistorySettings:
    interval: float = 15.0  # seconds between samples
    retention: float = 7 * 86400.0  # seconds of history kept
    max_mib: int = 256  # the database's cap

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None) -> HistorySettings:
        """`[history]` of the admin's config (interval, retention, max_mib); the defaults
        without one."""
        site = read_site_config(env)
        path = site.path
        section = (site.data or {}).get("history") or {}
        if not isinstance(section, dict) or set(section) - {"interval", "retention", "max_mib"}:
            raise UsageError(f"{path}: [history] takes interval, retention and max_mib only")
        max_mib = section.get("max_mib", cls.max_mib)
        if isinstance(max_mib, bool) or not isinstance(max_mib, int) or max_mib < 1:
            raise UsageError(f"{path}: [history] max_mib = {max_mib!r} is not a size in MiB")
        return cls(
            seconds(section.get("interval", cls.interval), "history", "interval", path),
            seconds(section.get("retention", cls.retention), "history", "retention", path),
            max_mib,
        )


class Sampler:
    """Writes one round of readings per interval into `history` until stopped."""

    def __init__(
        self,
        history: History,
        settings: HistorySettings,
        detect: Callable[[NvmlListener], Host | str],
        listener: NvmlListener,
        lock: threading.Lock | None = None,
        *,
        owns_listener: bool = False,
    ) -> None:
        self.history = history
        self.settings = settings
        self.detect = detect
        self.listener = listener
        self.owns_listener = owns_listener  # started for it: `close` stops it
        self.lock = lock or threading.Lock()  # shared with the exporter's scrapes, if any
        self._seen: dict[tuple[int, int], int] = {}  # XID counts already recorded
        self.stopped = threading.Event()
        self.note: str | None = None  # why the last round found no GPUs or failed
        self.last_sample: float | None = None

    def round(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self.lock:  # one NVML reading at a time in this process
            self.listener.drain()
            host = self.detect(self.listener)
            counts = dict(self.listener.counts)
        if isinstance(host, str):
            self.note = host
            return
        self.note = None if host.gpus else (host.note or "no NVIDIA GPU")
        by_index = {gpu.index: gpu.key for gpu in host.gpus}
        if host.source != "nvml":  # a host file lists the XIDs it saw: each counts once,
            counts = dict.fromkeys(((g.index, x) for g in host.gpus for x in g.xids), 1)
            for index, xid in counts:  # across samplers too: never again at each start
                key = by_index.get(index, str(index))
                if (index, xid) not in self._seen and self.history.has_xid(
                    key, xid, now - self.settings.retention
                ):
                    self._seen[(index, xid)] = 1
        xids = []
        for (index, xid), count in counts.items():
            for _ in range(count - self._seen.get((index, xid), 0)):
                xids.append(Xid(now, by_index.get(index, str(index)), index, xid))
            self._seen[(index, xid)] = count
        self.history.record(now, host.gpus, xids)
        self.history.prune(now - self.settings.retention)
        if xids:
            self.history.publish_xids(now - RECENT_XIDS)
        self.last_sample = now

    def run(self) -> None:
        """Rounds until `stopped` is set; the first at once. A round that fails (a full
        disk, NVML gone) is noted for the page and tried again next interval."""
        while True:
            try:
                self.round()
            except GpuenvError as exc:
                self.note = f"the last sample was not recorded: {exc.message}"
            except Exception as exc:  # the sampler outlives any one round (NVML, a bug)
                self.note = f"the last sample was not recorded: {exc}"
            if self.stopped.wait(self.settings.interval):
                return

    def close(self) -> None:
        """Close the history (after the rounds stopped), and the NVML session where it
        is the sampler's own."""
        self.history.close()
        if self.owns_listener:
            self.listener.stop()


def detect_sampled(listener: NvmlListener) -> Host | str:
    """This host through the sampler's long-lived NVML session (so XIDs are seen), or the
    host file GPUENV_HOST_FILE names."""
    described = os.environ.get(HOST_FILE_ENV)
    return load_host_file(described) if described else detect_nvml(listener.xids)
