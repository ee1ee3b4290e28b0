"""gpuenv exporter: this host's GPUs as Prometheus metrics (prometheus_client, imported
here only and only when the command runs; each scrape's samples come from
gpuenv.app.exporter as plain metric families)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from typing import Any

import click
from prometheus_client import start_http_server
from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily

from gpuenv.app.exporter import NAMES, GpuReadings, alert_rules
from gpuenv.app.sampler import HistorySettings
from gpuenv.cli import ui
from gpuenv.cli.context import Application
from gpuenv.cli.listen import bind_hint, parse_listen
from gpuenv.errors import ExporterError, UsageError

DEFAULT_LISTEN = "127.0.0.1:9478"


class GpuCollector:
    """prometheus_client's collector: each scrape's readings as its metric families."""

    def __init__(self, readings: GpuReadings) -> None:
        self.readings = readings

    def collect(self) -> Iterator[Any]:
        scrape = self.readings.scrape()
        up = GaugeMetricFamily(
            "gpuenv_exporter_nvml_up", "1 if the exporter could read the GPUs through NVML."
        )
        up.add_metric([], 1 if scrape.nvml_up else 0)
        yield up
        for family in scrape.families:
            kind = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
            metric = kind(family.name, family.help, labels=family.labels)
            for labels, value in family.samples:
                metric.add_metric(list(labels), value)
            yield metric


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
        click.echo(alert_rules(), nl=False)
        return
    address, port = parse_listen(listen, DEFAULT_LISTEN)
    settings = HistorySettings.load() if history else None
    readings = GpuReadings(app.engine, names)
    readings.start()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuCollector(readings))
    sampler = None
    if settings is not None:
        sampler, why = readings.sampler(settings)
        if why is not None:
            ui.warn(f"no history from this exporter: {why}")
    try:
        server, thread = start_http_server(port, addr=address, registry=registry)
    except OSError as exc:
        if sampler is not None:
            sampler.close()
        readings.stop()
        raise ExporterError(
            f"cannot listen on {listen}: {exc.strerror or exc}", hint=bind_hint(exc, port, 9478)
        ) from None
    sampling = threading.Thread(target=sampler.run, daemon=True) if sampler else None
    if sampling is not None:
        sampling.start()
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    note = f" ({readings.note})" if readings.note else ""
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
            sampler.close()
        readings.stop()
