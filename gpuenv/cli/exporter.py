"""gpuenv exporter: this host's GPUs as Prometheus metrics (prometheus_client, imported
here only and only when the command runs; the samples come from gpuenv.monitoring.metrics,
and under dcgm-exporter's names from gpuenv.monitoring.dcgm)."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

import click
from prometheus_client import start_http_server
from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily

from gpuenv.app.sampler import HistorySettings, Sampler, detect_sampled
from gpuenv.cli import ui
from gpuenv.cli.context import Application
from gpuenv.cli.listen import bind_hint, parse_listen
from gpuenv.errors import ExporterError, GpuenvError, UsageError
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

DEFAULT_LISTEN = "127.0.0.1:9478"
NAMES = ("gpuenv", "dcgm", "both")


class GpuCollector:
    """Reads the GPUs at each scrape (one scrape at a time) and yields metric families:
    gpuenv's, dcgm-exporter's names, or both (`names`)."""

    def __init__(
        self, listener: NvmlListener, names: str = "gpuenv", app: Application | None = None
    ) -> None:
        self.listener = listener
        self.names = names
        self.app = app or Application()  # its engine client, made at the first scrape
        self.hostname = socket.gethostname()  # dcgm-exporter's Hostname: os.Hostname()
        self.lock = threading.Lock()

    def collect(self) -> Iterator[Any]:
        with self.lock:
            self.listener.drain()
            described = os.environ.get(HOST_FILE_ENV)
            host = load_host_file(described) if described else detect_nvml(self.listener.xids)
            up = GaugeMetricFamily(
                "gpuenv_exporter_nvml_up", "1 if the exporter could read the GPUs through NVML."
            )
            # A host file is not NVML: 0 there too, so an alert on it never reads a
            # description as a healthy driver.
            up.add_metric([], 1 if not isinstance(host, str) and host.source == "nvml" else 0)
            yield up
            if isinstance(host, str):
                return
            for family in self._families(host, described is not None):
                kind = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
                metric = kind(family.name, family.help, labels=family.labels)
                for labels, value in family.samples:
                    metric.add_metric(list(labels), value)
                yield metric

    def _families(self, host: Host, described: bool) -> list[Family]:
        xid_counts: Mapping[tuple[int, int], int] = self.listener.counts
        last_xid: Mapping[int, int] = self.listener.last_xid
        if described:  # the file's XIDs, each one seen once, the last one last
            xid_counts = Counter((gpu.index, xid) for gpu in host.gpus for xid in gpu.xids)
            last_xid = {gpu.index: gpu.xids[-1] for gpu in host.gpus if gpu.xids}
        claims, idle = _claims_and_idle()
        try:
            runs, answers = list_runs(self.app.engine()), 1.0
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


@click.command()
@click.option(
    "--listen",
    default=DEFAULT_LISTEN,
    show_default=True,
    metavar="HOST:PORT",
    help="Where to serve /metrics (0.0.0.0:PORT for every interface).",
)
@click.option(
    "--names",
    type=click.Choice(NAMES),
    default="gpuenv",
    show_default=True,
    help="Metric names: gpuenv's own, dcgm-exporter's (DCGM_FI_DEV_*, for its dashboards), "
    "or both.",
)
@click.option(
    "--print-alert-rules",
    is_flag=True,
    help="Print gpuenv's Prometheus alert rules (YAML) and exit.",
)
@click.option(
    "--history",
    is_flag=True,
    help="Also sample the GPUs (and XIDs) into your history in the state folder, for "
    "`gpuenv dashboard`, `top` and `doctor` ([history] settings).",
)
@click.pass_obj
def exporter(
    app: Application, listen: str, names: str, print_alert_rules: bool, history: bool
) -> None:
    """Serve this host's GPUs as Prometheus metrics on http://HOST:PORT/metrics.

    Per GPU: utilization, memory, temperature and the GPU's slowdown threshold, power
    and its limit, clocks, clock event (throttle) reasons, PCIe link, ECC errors, XID
    errors seen while it runs, gpuenv's health findings and how long a claimed GPU has
    been idle; labelled with the GPU's index and UUID and, where a gpuenv run holds the
    GPU, its project, user and run.

    --names dcgm serves dcgm-exporter's names, units and labels instead
    (DCGM_FI_DEV_GPU_UTIL, ..._FB_USED in MiB, gpu, UUID, modelName, Hostname, ...), with
    the same project, user and run labels, so its Grafana dashboard (12239) works on GPUs
    DCGM cannot serve; --names both serves the two.

    --history makes it the sampler `gpuenv dashboard` reads (as a service, the one that
    keeps history while nobody looks); without it, the dashboard samples for itself.

    Bound to 127.0.0.1 unless --listen says otherwise. Runs until Ctrl-C or SIGTERM.
    Exits 20 when it cannot listen there. --print-alert-rules prints the alert rules to
    load into Prometheus (see the monitoring reference).
    """
    if print_alert_rules:
        if names == "dcgm":
            raise UsageError(
                "gpuenv's alert rules are written on its own metric names (gpuenv_gpu_*), "
                "which --names dcgm does not serve: loaded into Prometheus, they would "
                "never fire",
                hint="serve both with `gpuenv exporter --names both` (the rules then fire, "
                "and DCGM's dashboards work), and print them with --names both",
            )
        click.echo(ALERT_RULES.read_text(encoding="utf-8"), nl=False)
        return
    address, port = parse_listen(listen, DEFAULT_LISTEN)
    settings = HistorySettings.load() if history else None
    listener = NvmlListener()
    listener.start()
    collector = GpuCollector(listener, names, app)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    sampler = _sampler(listener, collector.lock, settings) if settings else None
    try:
        server, thread = start_http_server(port, addr=address, registry=registry)
    except OSError as exc:
        if sampler is not None:
            sampler.history.close()
        listener.stop()
        raise ExporterError(
            f"cannot listen on {listen}: {exc.strerror or exc}", hint=bind_hint(exc, port, 9478)
        ) from None
    sampling = threading.Thread(target=sampler.run, daemon=True) if sampler else None
    if sampling is not None:
        sampling.start()
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    note = f" ({listener.note})" if listener.note else ""
    ui.info(f"serving GPU metrics on http://{listen}/metrics{note}")
    try:
        stopped.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        thread.join(timeout=5)
        if sampler is not None and sampling is not None:
            sampler.stopped.set()
            sampling.join(timeout=10)
            sampler.history.close()
        listener.stop()


def _sampler(
    listener: NvmlListener, lock: threading.Lock, settings: HistorySettings
) -> Sampler | None:
    """The history sampler on the exporter's own NVML session; None, with a warning,
    where another process of this user samples or the history folder is not usable."""
    try:
        history = History.for_sampling(open_state(), settings.max_mib)
    except SamplerBusy as exc:
        ui.warn(f"no history from this exporter: another process samples into {exc}")
        return None
    except GpuenvError as exc:
        ui.warn(f"no history from this exporter: {exc.message}")
        return None
    return Sampler(history, settings, detect_sampled, listener, lock)
