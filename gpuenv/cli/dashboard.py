"""gpuenv dashboard: a read-only web page of this host's GPUs, who holds them, their
history and GPU-hours, served by the standard library's HTTP server (the page's files
ship in the wheel: gpuenv/cli/static/, no CDN, no build step)."""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
import signal
import sqlite3
import stat
import threading
import time
import urllib.parse
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

import click

from gpuenv.app.dashboard import (
    WINDOWS,
    HistorySource,
    PrometheusHistory,
    SqliteHistory,
    gpus_payload,
    history_payload,
    sizing_payload,
    usage_payload,
)
from gpuenv.app.sampler import HistorySettings, Sampler, detect_sampled
from gpuenv.cli import ui
from gpuenv.cli.app import engine
from gpuenv.cli.charts import READINGS, line_chart
from gpuenv.cli.listen import bind_hint, parse_listen
from gpuenv.errors import ExporterError, GpuenvError, UsageError
from gpuenv.host.machine import Host
from gpuenv.host.nvml import NvmlListener
from gpuenv.sharing.history import History, SamplerBusy
from gpuenv.sharing.statedir import Folder, open_state, owner_name

DEFAULT_LISTEN = "127.0.0.1:8478"
TOKEN_ENV = "GPUENV_DASHBOARD_TOKEN"
COOKIE = "gpuenv_dashboard"
STATIC = {
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
    "favicon.svg": "image/svg+xml",
}
HEADERS = {
    # Everything the page loads is its own: no inline script, no other origin.
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _static(name: str) -> bytes:
    return resources.files("gpuenv.cli").joinpath("static", name).read_bytes()


def _loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def read_token(token_file: str | None) -> str | None:
    """The viewers' token: the file's first line (a file of the user's own that others
    cannot read), else GPUENV_DASHBOARD_TOKEN."""
    if token_file:
        try:
            fd = os.open(token_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as exc:
            raise UsageError(f"--token-file {token_file}: {exc.strerror}") from None
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
                raise UsageError(f"--token-file {token_file}: not a file of yours")
            if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise UsageError(
                    f"--token-file {token_file}: other users can read it",
                    hint=f"chmod 600 {token_file}",
                )
            lines = handle.read(4096).decode("utf-8", "replace").splitlines()
        token = lines[0].strip() if lines else ""
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
    if token and len(token) < 16:
        raise UsageError("the dashboard token is shorter than 16 characters: use a longer one")
    return token or None


class Site:
    """What the handler serves: the payload functions and the token."""

    def __init__(self, history: HistorySource | None, sampler: str, token: str | None) -> None:
        self.history = history
        self.sampler = sampler
        self.token = token
        self.lock = threading.Lock()  # one host reading at a time (NVML, the engine)
        self._sizing: tuple[float, list[dict[str, str]]] = (0.0, [])

    def sizing(self, host: Host) -> list[dict[str, str]]:
        """The right-sizing checks, read at most once a minute (they change slowly)."""
        read_at, found = self._sizing
        if time.monotonic() - read_at > 60 or not read_at:
            found = sizing_payload(engine, host)
            self._sizing = (time.monotonic(), found)
        return found

    def allowed(self, headers: Any) -> bool:
        if self.token is None:
            return True
        given = headers.get("Authorization", "").removeprefix("Bearer ").strip()
        for part in headers.get("Cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE:
                given = given or value
        return hmac.compare_digest(given.encode(), self.token.encode())

    def api(self, path: str, query: dict[str, str]) -> tuple[str, bytes]:
        """(content type, body) of an API path; KeyError for an unknown one, ValueError
        for a bad query."""
        with self.lock:
            if path == "/api/gpus":
                return _json(gpus_payload(engine, self.history, self.sampler, self.sizing))
            if path == "/api/usage":
                return _json(usage_payload())
            window = query.get("window", "1h")
            if window not in WINDOWS:
                raise ValueError(f"window must be one of {', '.join(WINDOWS)}")
            if path == "/api/history":
                return _json(history_payload(self.history, query.get("gpu", ""), window))
            if path == "/chart.svg":
                reading = query.get("reading", "utilization")
                if reading not in READINGS:
                    raise ValueError(f"reading must be one of {', '.join(READINGS)}")
                data = history_payload(self.history, query.get("gpu", ""), window)
                now = time.time()
                svg = line_chart(data["points"], reading, now - WINDOWS[window], now)
                return "image/svg+xml", svg.encode()
        raise KeyError(path)


def _json(data: Any) -> tuple[str, bytes]:
    return "application/json", json.dumps(data).encode()


Response = tuple[int, str, bytes, dict[str, str]]  # status, content type, body, headers


def _error(status: HTTPStatus, message: str) -> Response:
    return status, "application/json", json.dumps({"error": message}).encode(), {}


def respond(site: Site, path: str, headers: Any) -> Response:
    """The answer to GET `path` (with its query): the page, its files, or the API."""
    url = urllib.parse.urlsplit(path)
    query = dict(urllib.parse.parse_qsl(url.query))
    if url.path == "/" and site.token and "token" in query:
        if not hmac.compare_digest(query["token"].encode(), site.token.encode()):
            return _error(HTTPStatus.UNAUTHORIZED, "wrong token")
        cookie = f"{COOKIE}={site.token}; HttpOnly; SameSite=Strict; Path=/"
        return HTTPStatus.SEE_OTHER, "text/plain", b"", {"Location": "/", "Set-Cookie": cookie}
    if not site.allowed(headers):
        return _error(HTTPStatus.UNAUTHORIZED, "a token is needed: open /?token=TOKEN once")
    if url.path == "/favicon.ico":  # browsers ask for it whatever the page says
        return HTTPStatus.OK, "image/svg+xml", _static("favicon.svg"), {}
    if url.path in ("/", "/index.html"):
        return HTTPStatus.OK, "text/html", _static("index.html"), {}
    name = url.path.removeprefix("/static/")
    if name in STATIC:
        return HTTPStatus.OK, STATIC[name], _static(name), {}
    try:
        kind, body = site.api(url.path, query)
    except KeyError:
        return _error(HTTPStatus.NOT_FOUND, f"no page {url.path}")
    except ValueError as exc:
        return _error(HTTPStatus.BAD_REQUEST, str(exc))
    except (GpuenvError, sqlite3.Error, OSError) as exc:
        message = exc.message if isinstance(exc, GpuenvError) else str(exc)
        return _error(HTTPStatus.SERVICE_UNAVAILABLE, message)
    return HTTPStatus.OK, kind, body, {}


def handler_for(site: Site) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "gpuenv-dashboard"
        sys_version = ""

        def log_message(self, format: str, *args: Any) -> None:
            pass  # no access log: the page is polled every few seconds

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            status, kind, body, extra = respond(site, self.path, self.headers)
            self.send_response(status)
            self.send_header("Content-Type", f"{kind}; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            for name, value in {**HEADERS, **extra}.items():
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

    return Handler


def _history(
    folder: Folder, settings: HistorySettings
) -> tuple[SqliteHistory, str, Sampler | None]:
    """Where the page's history comes from, and the sampler this process runs (if any):
    root's sampler when it is alive, else this user's own (sampled here unless another
    process of theirs already does)."""
    uid = os.getuid()
    if uid != 0:
        root = History.for_reading(folder, 0)
        if root is not None:
            try:
                last = root.last_sample()
            finally:
                root.close()
            if last is not None and time.time() - last < 3 * settings.interval:
                return _reader(folder, 0), "root's sampler", None
    try:
        history = History.for_sampling(folder, settings.max_mib)
    except SamplerBusy:
        return _reader(folder, uid), f"another process of {owner_name(uid)}'s", None
    listener = NvmlListener()
    listener.start()
    return (
        _reader(folder, uid),
        "this dashboard",
        Sampler(history, settings, detect_sampled, listener),
    )


def _reader(folder: Folder, uid: int) -> SqliteHistory:
    where = os.path.join(folder.path, f"history-{uid}")

    def open_history() -> History | None:
        return History.for_reading(folder, uid)

    return SqliteHistory(open_history, where)


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
def dashboard(listen: str, token_file: str | None, prometheus: str | None) -> None:
    """Serve a read-only page of this host's GPUs on http://HOST:PORT/ (loopback by
    default): live utilization, memory, temperature against the GPU's slowdown
    threshold, power against its cap, clock-event reasons and health findings; who
    holds each GPU, since when and for how long it has been idle; the wait queue and
    detached runs; charts of the last hour and day; GPU-hours (and cost, where prices
    are configured) per user and project for 7 and 30 days.

    \b
    History: sampled by this process into the state folder (SQLite), unless root's
    sampler (a systemd service) or another process of yours already samples; interval,
    retention and size in /etc/gpuenv/config.toml [history]. With --prometheus, read
    from Prometheus instead. A viewer sees what `gpuenv ps` and `usage` show the user
    the dashboard runs as; no command lines, environment values or process IDs.
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
    if prometheus:
        if not prometheus.startswith(("http://", "https://")):
            raise UsageError(f"--prometheus {prometheus!r}: expected an http:// or https:// URL")
        history: HistorySource = PrometheusHistory(prometheus)
        who = "Prometheus"
    else:
        settings = HistorySettings.load()
        folder = open_state()
        history, who, sampler = _history(folder, settings)
    try:
        server = ThreadingHTTPServer((address, port), handler_for(Site(history, who, token)))
    except OSError as exc:
        if sampler is not None:
            sampler.history.close()
            sampler.listener.stop()
        raise ExporterError(
            f"cannot listen on {listen}: {exc.strerror or exc}", hint=bind_hint(exc, port, 8478)
        ) from None
    server.daemon_threads = True
    threads = [threading.Thread(target=server.serve_forever, daemon=True)]
    if sampler is not None:
        threads.append(threading.Thread(target=sampler.run, daemon=True))
    for thread in threads:
        thread.start()
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    ui.info(f"serving the dashboard on http://{listen}/ (history: {history.name}, sampler: {who})")
    try:
        stopped.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        if sampler is not None:
            sampler.stopped.set()
            threads[-1].join(timeout=10)
            sampler.history.close()
            sampler.listener.stop()
