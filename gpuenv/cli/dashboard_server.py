"""What `gpuenv dashboard` answers over HTTP (the standard library's server): the page,
its files and the JSON behind it, to whom.

- Without a token (loopback only), a request must name a loopback address (an IP literal
  of 127.0.0.0/8 or ::1, or `localhost`) and the page's port in its Host header (no DNS
  rebinding: a name that resolves to loopback is refused), and the viewer is the local
  user whose process holds the connection (/proc/net/tcp): GPU-hours are theirs alone,
  or everyone's for root, as `gpuenv usage` shows them.
- With a token, the token (`Authorization: Bearer`, or `/?token=` once, which sets a
  cookie of this instance holding a random session value, never the token) is needed
  for everything, and token holders see what the dashboard's user sees.
- Under load and abuse: at most MAX_CONNECTIONS connections at once (others get 503 at
  once), a request must arrive whole within REQUEST_DEADLINE seconds (a client sending
  a byte every few seconds is cut off), and every answer, the server's own error pages
  (400, 414, 501) included, carries the security headers.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import json
import os
import re
import secrets
import socket
import stat
import threading
import time
import urllib.parse
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from gpuenv.app.dashboard import (
    WINDOWS,
    HistorySource,
    SizingChecks,
    gpus_payload,
    history_payload,
    usage_payload,
    viewer_uid,
)
from gpuenv.cli.charts import READINGS, line_chart
from gpuenv.cli.context import Application
from gpuenv.common import strictjson
from gpuenv.errors import GpuenvError, UsageError

TOKEN_ENV = "GPUENV_DASHBOARD_TOKEN"
TOKEN_CHARACTERS = r"[A-Za-z0-9._~-]{16,256}"  # safe in a URL and a cookie as it is
STATIC = {
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
    "favicon.svg": "image/svg+xml",
}
HEADERS = {
    # Everything the page loads is its own: no inline script, no other origin.
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
        "base-uri 'none'; form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
Response = tuple[int, str, bytes, dict[str, str]]  # status, content type, body, headers
MAX_CONNECTIONS = 64  # at once; the page polls with one or two per viewer
REQUEST_DEADLINE = 10.0  # seconds from the connection to the end of the request's headers


def _static(name: str) -> bytes:
    return resources.files("gpuenv.cli").joinpath("static", name).read_bytes()


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
    if token and not re.fullmatch(TOKEN_CHARACTERS, token):
        raise UsageError(
            "the dashboard token must be 16 to 256 letters, digits and . _ ~ - (it goes in "
            "addresses and cookies as it is)",
            hint="make one with `openssl rand -hex 24`",
        )
    return token or None


class Site:
    """What the handler serves, and to whom."""

    def __init__(
        self,
        history: HistorySource | None,
        status: Callable[[], dict[str, Any]],
        token: str | None,
        port: int,
        app: Application | None = None,
    ) -> None:
        self.app = app or Application()  # one engine client for every request
        self.history = history
        self.status = status  # who samples, and how it goes
        self.token = token
        self.cookie = f"gpuenv_dashboard_{port}"  # cookies are not kept apart by port
        self.session = secrets.token_urlsafe(32)
        self.port = port
        self.hosts = {f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"}  # for people
        self.lock = threading.Lock()  # one host reading at a time (NVML, the engine)
        self.sizing = SizingChecks(self.app.engine)  # read at most once a minute

    def allowed(self, headers: Any) -> bool:
        if self.token is None:
            return loopback_host(headers.get("Host", ""), self.port)
        bearer = headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if bearer and hmac.compare_digest(bearer.encode(), self.token.encode()):
            return True
        for part in headers.get("Cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == self.cookie and hmac.compare_digest(value.encode(), self.session.encode()):
                return True
        return False

    def api(self, path: str, query: dict[str, str], viewer: int | None) -> tuple[str, bytes]:
        """(content type, body) of an API path; KeyError for an unknown one, ValueError
        for a bad query."""
        if path == "/api/usage":
            return _json(usage_payload(viewer))
        with self.lock:
            if path == "/api/gpus":
                return _json(
                    gpus_payload(self.app.engine, self.history, self.status(), self.sizing)
                )
            window = query.get("window", "1h")
            if window not in WINDOWS:
                raise ValueError(f"window must be one of {', '.join(WINDOWS)}")
            gpu = query.get("gpu", "")
            if path == "/api/history":
                return _json(history_payload(self.history, gpu, window))
            if path == "/chart.svg":
                reading = query.get("reading", "utilization")
                if reading not in READINGS:
                    raise ValueError(f"reading must be one of {', '.join(READINGS)}")
                data = history_payload(self.history, gpu, window, (reading,))
                now = time.time()
                svg = line_chart(data["points"], reading, now - WINDOWS[window], now)
                return "image/svg+xml", svg.encode()
        raise KeyError(path)


def loopback_host(header: str, port: int) -> bool:
    """Whether a Host header names this page on a loopback address: an IP literal (any of
    127.0.0.0/8, ::1) or `localhost`, with the page's port. A name that resolves to
    loopback (DNS rebinding) is refused.

    >>> [loopback_host(h, 8478) for h in ("127.0.0.2:8478", "[::1]:8478", "localhost:8478")]
    [True, True, True]
    >>> [loopback_host(h, 8478) for h in ("evil.example:8478", "127.0.0.1:80", "127.0.0.1")]
    [False, False, False]
    """
    name, _, given = header.rpartition(":")
    if not given.isdigit() or int(given) != port:
        return False
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name.removeprefix("[").removesuffix("]")).is_loopback
    except ValueError:
        return False


def _json(data: Any) -> tuple[str, bytes]:
    return "application/json", strictjson.dumps(data).encode()


def _error(status: HTTPStatus, message: str) -> Response:
    return status, "application/json", json.dumps({"error": message}).encode(), {}


def _token_given(query: str) -> str | None:
    """The `token` parameter as written (percent-decoded, a `+` kept as it is)."""
    for part in query.split("&"):
        name, _, value = part.partition("=")
        if name == "token":
            return urllib.parse.unquote(value)
    return None


def _gate(site: Site, url: urllib.parse.SplitResult, headers: Any) -> Response | None:
    """The answer to a request that may not pass (or that logs in); None: it may."""
    given = _token_given(url.query)
    if url.path == "/" and site.token and given is not None:
        if not hmac.compare_digest(given.encode(), site.token.encode()):
            return _error(HTTPStatus.UNAUTHORIZED, "wrong token")
        cookie = f"{site.cookie}={site.session}; HttpOnly; SameSite=Strict; Path=/"
        return HTTPStatus.SEE_OTHER, "text/plain", b"", {"Location": "/", "Set-Cookie": cookie}
    if site.allowed(headers):
        return None
    if site.token is None:
        hosts = " or ".join(sorted(site.hosts))
        return _error(
            HTTPStatus.FORBIDDEN, f"this page answers to {hosts} (or another loopback address) only"
        )
    return _error(HTTPStatus.UNAUTHORIZED, "a token is needed: open /?token=TOKEN once")


def respond(site: Site, path: str, headers: Any, viewer: Callable[[], int | None]) -> Response:
    """The answer to GET `path` (with its query): the page, its files, or the API.
    `viewer` tells whose process asks (None: not known)."""
    url = urllib.parse.urlsplit(path)
    refused = _gate(site, url, headers)
    if refused is not None:
        return refused
    if url.path == "/favicon.ico":  # browsers ask for it whatever the page says
        return HTTPStatus.OK, "image/svg+xml", _static("favicon.svg"), {}
    if url.path in ("/", "/index.html"):
        return HTTPStatus.OK, "text/html", _static("index.html"), {}
    name = url.path.removeprefix("/static/")
    if name in STATIC:
        return HTTPStatus.OK, STATIC[name], _static(name), {}
    query = dict(urllib.parse.parse_qsl(url.query))
    # A token holder sees what the dashboard's user sees; a loopback viewer, their own
    # (-1: nobody's, where /proc cannot tell who asks).
    who = None
    if site.token is None:
        peer = viewer() if url.path == "/api/usage" else None
        who = -1 if peer is None else peer
    try:
        kind, body = site.api(url.path, query, who)
    except KeyError:
        return _error(HTTPStatus.NOT_FOUND, f"no page {url.path}")
    except ValueError as exc:
        return _error(HTTPStatus.BAD_REQUEST, str(exc))
    except GpuenvError as exc:
        return _error(HTTPStatus.SERVICE_UNAVAILABLE, exc.message)
    except OSError as exc:
        return _error(HTTPStatus.SERVICE_UNAVAILABLE, str(exc))
    return HTTPStatus.OK, kind, body, {}


class _Guarded(BaseHTTPRequestHandler):
    """http.server's handler with a deadline on the request and the security headers on
    its own error answers."""

    server_version = "gpuenv-dashboard"
    sys_version = ""
    timeout = 15  # an idle connection does not hold a thread for ever

    def log_message(self, format: str, *args: Any) -> None:
        pass  # no access log: the page is polled every few seconds

    def setup(self) -> None:
        super().setup()
        # The whole request within REQUEST_DEADLINE, however slowly it trickles in: past
        # it the connection is shut, and the read this thread waits in ends.
        self._deadline = threading.Timer(REQUEST_DEADLINE, self._cut_off)
        self._deadline.daemon = True
        self._deadline.start()

    def _cut_off(self) -> None:
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def finish(self) -> None:
        self._deadline.cancel()
        super().finish()

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The server's own error answers (400, 414, 501, …): JSON, with the security
        headers every answer carries, instead of http.server's bare HTML."""
        self._deadline.cancel()
        if self.request_version == "HTTP/0.9":  # a line it could not read: answered in 1.0,
            self.request_version = "HTTP/1.0"  # so that the status and headers are sent
        text = message or HTTPStatus(code).phrase
        body = json.dumps({"error": text}).encode()
        self.send_response(code, text)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        for name, value in HEADERS.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def handler_for(site: Site) -> type[BaseHTTPRequestHandler]:
    class Handler(_Guarded):
        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            self._deadline.cancel()  # the request is in: answering may take its time

            def viewer() -> int | None:
                client = (str(self.client_address[0]), int(self.client_address[1]))
                host, port = self.connection.getsockname()[:2]  # the server's end
                return viewer_uid(client, (str(host), int(port)))

            status, kind, body, extra = respond(site, self.path, self.headers, viewer)
            self.send_response(status)
            self.send_header("Content-Type", f"{kind}; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            for name, value in {**HEADERS, **extra}.items():
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

    return Handler


def serve(address: str, port: int, site: Site) -> ThreadingHTTPServer:
    """The server, bound (an IPv6 address too); OSError when it cannot be."""

    class Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in address else socket.AF_INET
        daemon_threads = True
        open_slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

        def process_request(self, request: Any, client_address: Any) -> None:
            if not self.open_slots.acquire(blocking=False):
                _busy(request)
                self.shutdown_request(request)
                return
            super().process_request(request, client_address)

        def process_request_thread(self, request: Any, client_address: Any) -> None:
            try:
                super().process_request_thread(request, client_address)
            finally:
                self.open_slots.release()

    return Server((address, port), handler_for(site))


def _busy(connection: socket.socket) -> None:
    """Over MAX_CONNECTIONS: 503 at once, with the headers, without reading the request."""
    body = json.dumps({"error": "too many connections: try again in a moment"}).encode()
    head = [
        "HTTP/1.0 503 Service Unavailable",
        "Content-Type: application/json; charset=utf-8",
        f"Content-Length: {len(body)}",
        "Retry-After: 1",
        "Connection: close",
        *(f"{name}: {value}" for name, value in HEADERS.items()),
    ]
    with contextlib.suppress(OSError):
        connection.settimeout(1)
        connection.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
