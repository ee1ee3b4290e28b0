"""gpuenv exporter: this host's GPUs as Prometheus metrics (prometheus_client, imported
here only and only when the command runs; the samples come from gpuenv.sharing.metrics)."""

from __future__ import annotations

import errno
import os
import signal
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import click
from prometheus_client import start_http_server
from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily

from gpuenv.cli import ui
from gpuenv.cli.app import engine
from gpuenv.errors import ExporterError, GpuenvError, UsageError
from gpuenv.host.hostfile import HOST_FILE_ENV, load_host_file
from gpuenv.host.nvml import NvmlListener, detect_nvml
from gpuenv.sharing.claims import ClaimStore
from gpuenv.sharing.metrics import families, holders
from gpuenv.sharing.monitor import list_runs

DEFAULT_LISTEN = "127.0.0.1:9478"


def parse_listen(text: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets) -> (host, port); a usage error otherwise."""
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(
            f"--listen {text!r}: expected HOST:PORT, e.g. {DEFAULT_LISTEN} or 0.0.0.0:9478"
        )
    return host, int(port)


def _bind_hint(exc: OSError, port: int) -> str:
    """What to do when the address cannot be bound, by why."""
    if exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
        return (
            f"that address is not one of this host's: give one of its addresses, or "
            f"0.0.0.0:{port} for every interface"
        )
    if exc.errno == errno.EACCES:
        return "ports below 1024 need root: pick a port above 1024 (9478 is the default)"
    if exc.errno == errno.EADDRINUSE:
        return "something listens there already: pick another port, or stop it"
    return "pick another address with --listen HOST:PORT"


class GpuCollector:
    """Reads the GPUs at each scrape (one scrape at a time) and yields metric families."""

    def __init__(self, listener: NvmlListener) -> None:
        self.listener = listener
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
            xid_counts = self.listener.counts
            if described:  # the file's XIDs, each one seen once
                xid_counts = Counter((gpu.index, xid) for gpu in host.gpus for xid in gpu.xids)
            try:
                claims = ClaimStore().claims()
            except (GpuenvError, OSError):
                claims = []
            try:
                runs = list_runs(engine())
            except GpuenvError:
                runs = []
            for family in families(host, holders(claims, runs), xid_counts):
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
def exporter(listen: str) -> None:
    """Serve this host's GPUs as Prometheus metrics on http://HOST:PORT/metrics.

    Per GPU: utilization, memory, temperature and the GPU's slowdown threshold, power
    and its limit, clocks, clock event (throttle) reasons, PCIe link, ECC errors, XID
    errors seen while it runs, and gpuenv's health findings; labelled with the GPU's
    index and UUID and, where a gpuenv run holds the GPU, its project, user and run.
    Bound to 127.0.0.1 unless --listen says otherwise. Runs until Ctrl-C or SIGTERM.
    Exits 20 when it cannot listen there.
    """
    address, port = parse_listen(listen)
    listener = NvmlListener()
    listener.start()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuCollector(listener))
    try:
        server, thread = start_http_server(port, addr=address, registry=registry)
    except OSError as exc:
        listener.stop()
        raise ExporterError(
            f"cannot listen on {listen}: {exc.strerror or exc}", hint=_bind_hint(exc, port)
        ) from None
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
        listener.stop()
