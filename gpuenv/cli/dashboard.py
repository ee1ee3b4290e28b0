"""gpuenv dashboard: a read-only web page of this host's GPUs, who holds them, their
history and GPU-hours (served by gpuenv.cli.dashboard_server; the page's files ship in
the wheel: gpuenv/cli/static/, no CDN, no build step)."""

from __future__ import annotations

import ipaddress
import signal
import threading
from typing import Any

import click

from gpuenv.app.dashboard import HistorySource, PrometheusHistory, open_history
from gpuenv.app.sampler import HistorySettings
from gpuenv.cli import ui
from gpuenv.cli.context import Application
from gpuenv.cli.dashboard_server import TOKEN_ENV, Site, read_token, serve
from gpuenv.cli.listen import bind_hint, parse_listen
from gpuenv.errors import ExporterError, UsageError

DEFAULT_LISTEN = "127.0.0.1:8478"


def _loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


@click.command()
@click.option(
    "--listen",
    default=DEFAULT_LISTEN,
    show_default=True,
    metavar="HOST:PORT",
    help="Where to serve the page; an address other machines reach needs a token.",
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False),
    help=f"A file (yours, mode 600) whose first line is the viewers' token; or {TOKEN_ENV}.",
)
@click.option(
    "--prometheus",
    metavar="URL",
    help="Read the history from this Prometheus (which scrapes `gpuenv exporter`) "
    "instead of sampling into the state folder.",
)
@click.pass_obj
def dashboard(
    app: Application, listen: str, token_file: str | None, prometheus: str | None
) -> None:
    """Serve a read-only page of this host's GPUs on http://HOST:PORT/ (loopback by
    default): live utilization, memory, temperature against the GPU's slowdown
    threshold, power against its cap, clock-event reasons and health findings; who
    holds each GPU, since when and for how long it has been idle; the wait queue and
    detached runs; charts of the last hour and day; GPU-hours (and cost, where prices
    are configured) per user and project for 7 and 30 days.

    \b
    History: sampled by this process into your history in the state folder (SQLite),
    unless another process of yours already samples; interval, retention and size in
    /etc/gpuenv/config.toml [history]. With --prometheus, read from Prometheus instead.
    On loopback, a viewer sees their own GPU-hours (root: everyone's), as `gpuenv usage`
    shows them; token holders see what the dashboard's user sees. Never command lines,
    environment values or process IDs.
    JSON behind the page: /api/gpus, /api/history?gpu=KEY&window=1h|1d, /api/usage.
    Exits 2 for a bad option (a non-loopback --listen without a token), 20 when it
    cannot listen there."""
    address, port = parse_listen(listen, DEFAULT_LISTEN)
    token = read_token(token_file)
    if not _loopback(address) and token is None:
        raise UsageError(
            f"--listen {listen} serves other machines: the page needs a token",
            hint=f"put one in a file of yours (mode 600) and add --token-file FILE, or set "
            f"{TOKEN_ENV}; viewers open http://{listen}/?token=TOKEN once",
        )
    sampler = None
    history: HistorySource | None
    if prometheus:
        if not prometheus.startswith(("http://", "https://")):
            raise UsageError(f"--prometheus {prometheus!r}: expected an http:// or https:// URL")
        history, who = PrometheusHistory(prometheus), "Prometheus"
    else:
        settings = HistorySettings.load()
        history, who, sampler = open_history(settings)

    def status() -> dict[str, Any]:
        if sampler is None:
            return {"sampler": who, "note": None, "last_sample": None}
        return {"sampler": who, "note": sampler.note, "last_sample": sampler.last_sample}

    try:
        server = serve(address, port, Site(history, status, token, port, app))
    except OSError as exc:
        if sampler is not None:
            sampler.close()
        raise ExporterError(
            f"cannot listen on {listen}: {exc.strerror or exc}", hint=bind_hint(exc, port, 8478)
        ) from None
    threads = [threading.Thread(target=server.serve_forever, daemon=True)]
    if sampler is not None:
        threads.append(threading.Thread(target=sampler.run, daemon=True))
    for thread in threads:
        thread.start()
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    source = history.name if history else "none"
    ui.info(f"serving the dashboard on http://{listen}/ (history: {source}, sampler: {who})")
    try:
        stopped.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        if sampler is not None:
            sampler.stopped.set()
            threads[-1].join(timeout=10)
            sampler.close()
