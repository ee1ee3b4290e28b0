"""`gpuenv exporter`'s readings: at each scrape, this host's GPUs (through the exporter's
long-lived NVML session, so XIDs are seen, or the host file GPUENV_HOST_FILE names), who
holds them (the claims and the engine's runs) and for how long the claimed ones have
been idle, as plain metric families (gpuenv.monitoring.metrics, and under
dcgm-exporter's names gpuenv.monitoring.dcgm). The command turns them into
prometheus_client's, which nothing below the CLI imports."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuenv.app.sampler import HistorySettings, Sampler, detect_sampled
from gpuenv.engine.protocol import Engine
from gpuenv.errors import GpuenvError
from gpuenv.host.hostfile import HOST_FILE_ENV, load_host_file
from gpuenv.host.machine import Host
from gpuenv.host.nvml import NvmlListener, detect_nvml
from gpuenv.monitoring.dcgm import dcgm_families
from gpuenv.monitoring.history import History, SamplerBusy
from gpuenv.monitoring.idle import idle_for, known_state, load_policy
from gpuenv.monitoring.metrics import ALERT_RULES, Family, Holder, families, holders, idle_families
from gpuenv.monitoring.monitor import list_runs
from gpuenv.reservations.claims import Claim, ClaimStore
from gpuenv.reservations.statedir import open_state

NAMES = ("gpuenv", "dcgm", "both")


@dataclass(frozen=True)
class Scrape:
    """One scrape: whether the GPUs were read through NVML (a host file is not NVML:
    False there too, so an alert on it never reads a description as a healthy driver),
    and the metric families (none when the GPUs could not be read)."""

    nvml_up: bool
    families: list[Family]


class GpuReadings:
    """Reads the GPUs at each scrape (one scrape at a time, and never during one of the
    history sampler's rounds) as metric families: gpuenv's, dcgm-exporter's names, or
    both (`names`). Owns the NVML session XIDs are heard on (`start`, `stop`)."""

    def __init__(
        self,
        engine: Callable[[], Engine],
        names: str = "gpuenv",
        listener: NvmlListener | None = None,
    ) -> None:
        self.engine = engine  # asked at each scrape: one that does not answer is not fatal
        self.names = names
        self.listener = listener or NvmlListener()
        self.hostname = socket.gethostname()  # dcgm-exporter's Hostname: os.Hostname()
        self.lock = threading.Lock()

    def start(self) -> None:
        self.listener.start()

    def stop(self) -> None:
        self.listener.stop()

    @property
    def note(self) -> str | None:
        """Why XIDs are not heard (NVML's events unavailable), if they are not."""
        return self.listener.note

    def scrape(self) -> Scrape:
        with self.lock:
            self.listener.drain()
            described = os.environ.get(HOST_FILE_ENV)
            host = load_host_file(described) if described else detect_nvml(self.listener.xids)
            if isinstance(host, str):  # NVML cannot be read: why
                return Scrape(False, [])
            return Scrape(host.source == "nvml", self._families(host, described is not None))

    def _families(self, host: Host, described: bool) -> list[Family]:
        xid_counts: Mapping[tuple[int, int], int] = self.listener.counts
        last_xid: Mapping[int, int] = self.listener.last_xid
        if described:  # the file's XIDs, each one seen once, the last one last
            xid_counts = Counter((gpu.index, xid) for gpu in host.gpus for xid in gpu.xids)
            last_xid = {gpu.index: gpu.xids[-1] for gpu in host.gpus if gpu.xids}
        claims, idle = _claims_and_idle()
        try:
            runs, answers = list_runs(self.engine()), 1.0
        except GpuenvError:  # not reachable, or does not answer within seconds
            runs, answers = [], 0.0
        held = holders(claims, runs)
        out: list[Family] = [
            Family(
                "gpuenv_exporter_engine_up",
                "1 if the container engine answered (runs are attributed), 0 if it did not.",
                "gauge",
                (),
                [((), answers)],
            )
        ]
        if self.names in ("gpuenv", "both"):
            out += families(host, held, xid_counts)
            out += _idle(host, held, claims, idle)
        if self.names in ("dcgm", "both"):
            out += dcgm_families(host, held, last_xid, self.hostname)
        return out

    def sampler(self, settings: HistorySettings) -> tuple[Sampler | None, str | None]:
        """The history sampler on this NVML session, its rounds and the scrapes one at a
        time; (None, why) where another process of this user samples or the history
        folder is not usable."""
        try:
            history = History.for_sampling(open_state(), settings.max_mib)
        except SamplerBusy as exc:
            return None, f"another process samples into {exc}"
        except GpuenvError as exc:
            return None, exc.message
        return Sampler(history, settings, detect_sampled, self.listener, self.lock), None


def alert_rules() -> str:
    """gpuenv's Prometheus alert rules (YAML), written on its own metric names."""
    return ALERT_RULES.read_text(encoding="utf-8")


def _claims_and_idle() -> tuple[list[Claim], dict[str, Any]]:
    """The claims and `gpuenv idle`'s samples; none when the state folder is unusable."""
    try:
        store = ClaimStore()
    except (GpuenvError, OSError):
        return [], {}
    claims: list[Claim] = []
    state: dict[str, Any] = {}
    try:
        claims = store.claims()
        state = known_state(store)
    except (GpuenvError, OSError):
        pass  # what was read so far
    finally:
        store.close()
    return claims, state


def _idle(
    host: Host, held: Mapping[str, Holder], claims: list[Claim], state: dict[str, Any]
) -> list[Family]:
    """Idle time of each claimed GPU, and the policy's warning time (when there is one)."""
    now = time.time()
    seconds = {
        claim.gpu: idle for claim in claims if (idle := idle_for(state, claim.gpu, now)) is not None
    }
    try:
        policy, _ = load_policy()
    except GpuenvError:  # a broken policy file: `gpuenv idle` says so, the metrics go on
        policy = None
    return idle_families(host, held, seconds, policy.warn_after if policy else None)
