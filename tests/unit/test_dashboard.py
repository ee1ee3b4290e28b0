"""`gpuenv dashboard`'s server: who may read the page (a token off loopback), what each
path answers, and the charts it draws. Served on loopback in-process: no daemon."""

from __future__ import annotations

import json
import os
import pwd
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gpuenv.app.dashboard import usage_payload
from gpuenv.cli.charts import line_chart
from gpuenv.cli.dashboard_server import Site, read_token, serve
from gpuenv.cli.tree import main
from gpuenv.errors import UsageError
from gpuenv.monitoring.usage import UsageLog

TOKEN = "s3cret-token-of-the-lab"
STATUS = {"sampler": "none", "note": None, "last_sample": None}


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any) -> None:
        return None


def fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, headers=headers or {}), timeout=10) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


@pytest.fixture
def served() -> Iterator[Any]:
    servers = []

    def start(token: str | None, address: str = "127.0.0.1") -> str:
        probe = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
        probe.bind((address, 0))
        port = probe.getsockname()[1]
        probe.close()
        server = serve(address, port, Site(None, lambda: STATUS, token, port))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        host = f"[{address}]" if ":" in address else address
        return f"http://{host}:{port}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_without_a_token_loopback_viewers_get_the_page_and_its_files(served: Any) -> None:
    base = served(None)
    status, headers, body = fetch(base + "/")
    assert status == 200 and b"/static/dashboard.js" in body
    assert "default-src 'self'" in headers["Content-Security-Policy"]
    for name, kind in (("dashboard.js", "text/javascript"), ("dashboard.css", "text/css")):
        status, headers, _ = fetch(f"{base}/static/{name}")
        assert status == 200 and headers["Content-Type"].startswith(kind)


@pytest.mark.parametrize(
    ("path", "status", "says"),
    [
        ("/static/../../etc/passwd", 404, b"no page"),
        ("/api/history?window=2h", 400, b"window must be one of 1h, 1d"),
        ("/chart.svg?reading=cpu", 400, b"reading must be one of"),
        ("/api/secrets", 404, b"no page /api/secrets"),
    ],
)
def test_bad_paths_and_queries_get_a_json_error(
    served: Any, path: str, status: int, says: bytes
) -> None:
    answer, headers, body = fetch(served(None) + path)
    assert (
        answer == status and says in body and headers["Content-Type"].startswith("application/json")
    )


def test_with_a_token_nothing_is_served_without_it(served: Any) -> None:
    base = served(TOKEN)
    assert fetch(base + "/")[0] == 401
    assert fetch(base + "/api/usage")[0] == 401
    assert fetch(base + "/?token=wrong")[0] == 401
    port = base.rsplit(":", 1)[1]
    assert fetch(base + "/", {"Cookie": f"gpuenv_dashboard_{port}={TOKEN}"})[0] == 401
    status, headers, _ = fetch(f"{base}/?token={TOKEN}")
    assert status == 303 and headers["Location"] == "/"  # the token leaves the address bar
    cookie = headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert cookie.startswith(f"gpuenv_dashboard_{port}=")  # this instance's own cookie
    assert TOKEN not in cookie  # a session value: the token never goes to other ports
    assert fetch(base + "/", {"Cookie": cookie.split(";")[0]})[0] == 200
    assert fetch(base + "/", {"Authorization": f"Bearer {TOKEN}"})[0] == 200
    # the address may name any host with a token (the token is the check)
    assert fetch(base + "/", {"Authorization": f"Bearer {TOKEN}", "Host": "gpu-01:8478"})[0] == 200


def test_a_token_with_a_plus_or_a_percent_escape_is_read_as_written(served: Any) -> None:
    token = "abc+def~ghi.jkl_mno-123"
    base = served(token)
    assert fetch(f"{base}/?token={token}")[0] == 303
    assert fetch(f"{base}/?token=abc%2Bdef~ghi.jkl_mno-123")[0] == 303
    assert fetch(f"{base}/?token=abc def~ghi.jkl_mno-123".replace(" ", "%20"))[0] == 401


def test_without_a_token_only_the_pages_own_address_is_answered(served: Any) -> None:
    """No DNS rebinding: a page of evil.example that resolves to 127.0.0.1 names its own
    host in the Host header and is refused."""
    base = served(None)
    port = base.rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"):
        assert fetch(base + "/", {"Host": host})[0] == 200, host
    status, _, body = fetch(base + "/api/gpus", {"Host": f"evil.example:{port}"})
    assert status == 403 and b"answers to" in body


def test_ipv6_loopback_is_served(served: Any) -> None:
    assert fetch(served(None, "::1") + "/")[0] == 200


def test_a_non_loopback_address_needs_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUENV_DASHBOARD_TOKEN", raising=False)
    result = CliRunner().invoke(main, ["dashboard", "--listen", "0.0.0.0:8478"])
    assert result.exit_code == 2
    assert "serves other machines: the page needs a token" in result.output
    assert "--token-file" in result.output


@pytest.mark.parametrize(
    ("mode", "content", "problem"),
    [
        (0o600, f"{TOKEN}\n", None),
        (0o644, f"{TOKEN}\n", "other users can read it"),
        (0o600, "short\n", "must be 16 to 256 letters"),
        (0o600, "has;a;semicolon;in;it\n", "must be 16 to 256 letters"),
    ],
)
def test_token_files(tmp_path: Path, mode: int, content: str, problem: str | None) -> None:
    path = tmp_path / "token"
    path.write_text(content)
    path.chmod(mode)
    if problem is None:
        assert read_token(str(path)) == TOKEN
    else:
        with pytest.raises(UsageError, match=problem):
            read_token(str(path))


def test_a_token_file_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").write_text(TOKEN)
    (tmp_path / "real").chmod(0o600)
    (tmp_path / "token").symlink_to(tmp_path / "real")
    with pytest.raises(UsageError, match="--token-file"):
        read_token(str(tmp_path / "token"))


def test_charts_break_at_gaps_and_say_when_there_is_nothing() -> None:
    points = [
        {"t": 0, "power_w": 100.0, "power_limit_w": 400.0},
        {"t": 10, "power_w": 120.0, "power_limit_w": 400.0},
        {"t": 20, "power_w": None, "power_limit_w": None},
        {"t": 30, "power_w": 300.0, "power_limit_w": 400.0},
    ]
    svg = line_chart(points, "power_w", 0, 30)
    assert svg.count("<polyline") == 1 and svg.count("<circle") == 1  # two runs of samples
    assert 'class="limit"' in svg and "power (W): 300" in svg
    empty = line_chart([], "utilization", 0, 3600)
    assert "no samples yet" in empty and "<polyline" not in empty


def test_gpu_hours_are_the_viewers_own(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """As `gpuenv usage` shows them: root every user's, a user their own, nobody's for a
    viewer who cannot be told; a token holder what the dashboard's user may read."""
    monkeypatch.setenv("GPUENV_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("GPUENV_HOST_CONFIG", str(tmp_path / "none.yaml"))
    (tmp_path / "none.yaml").write_text("{}\n")
    log = UsageLog(str(tmp_path / "state"))
    run = log.begin("vision", [("GPU-0", "NVIDIA A100-SXM4-80GB")], start=time.time() - 7200)
    log.finish(run, 0, end=time.time() - 3600)
    me = os.getuid()

    def projects(viewer: int | None) -> list[str]:
        data = usage_payload(viewer)
        return [row["key"] for row in data["periods"][0]["by_project"]]

    assert projects(me) == ["vision"] and projects(None) == ["vision"]
    assert projects(me + 4242) == [] and projects(-1) == []
    assert usage_payload(-1)["viewer"] is None and usage_payload(None)["viewer"] is None


def test_the_loopback_viewer_is_told_by_the_connection(
    served: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GPUENV_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("GPUENV_HOST_CONFIG", str(tmp_path / "none.yaml"))
    (tmp_path / "none.yaml").write_text("{}\n")
    status, _, body = fetch(served(None) + "/api/usage")
    assert status == 200
    assert json.loads(body)["viewer"] == pwd.getpwuid(os.getuid()).pw_name


# -- under load and abuse (issue 33, item 5) -----------------------------------------------


def test_any_loopback_address_is_served_with_the_browsers_own_host_header(served: Any) -> None:
    """A dashboard on 127.0.0.2 refused the Host header the browser sends for it."""
    base = served(None, "127.0.0.2")
    assert base.startswith("http://127.0.0.2:")
    assert fetch(base + "/")[0] == 200
    port = base.rsplit(":", 1)[1]
    assert fetch(base + "/", {"Host": f"127.9.9.9:{port}"})[0] == 200  # any of 127.0.0.0/8
    assert fetch(base + "/", {"Host": f"127.0.0.2:{int(port) + 1}"})[0] == 403  # not its port
    assert fetch(base + "/", {"Host": f"rebind.example:{port}"})[0] == 403


def raw(base: str, data: bytes, wait: float = 10) -> bytes:
    host, port = base.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=wait) as connection:
        connection.sendall(data)
        chunks = []
        while chunk := connection.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"POST / HTTP/1.0\r\n\r\n", b"501"),  # a method the page does not answer
        (b"GET /" + b"a" * 70000 + b" HTTP/1.0\r\n\r\n", b"414"),  # a URI too long
        (b"NONSENSE\r\n\r\n", b"400"),
        (b"GET / HTTP/9.9\r\n\r\n", b"505"),
    ],
    ids=["501", "414", "400", "505"],
)
def test_the_servers_own_errors_carry_the_headers(
    served: Any, request_bytes: bytes, status: bytes
) -> None:
    """Answers http.server writes itself carried no Content-Security-Policy and no nosniff."""
    answer = raw(served(None), request_bytes)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0].split()[1] == status, head
    assert b"Content-Security-Policy: default-src 'self'" in head
    assert b"X-Content-Type-Options: nosniff" in head
    assert b"Content-Type: application/json" in head and b'"error"' in body


def test_the_csp_names_base_uri_and_form_action(served: Any) -> None:
    _, headers, _ = fetch(served(None) + "/")
    policy = headers["Content-Security-Policy"]
    assert "base-uri 'none'" in policy and "form-action 'none'" in policy


def test_a_client_that_trickles_its_request_is_cut_off(
    served: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A byte every half second never trips a per-read timeout; the deadline on the whole
    request does, before any token is checked."""
    import gpuenv.cli.dashboard_server as server_module

    monkeypatch.setattr(server_module, "REQUEST_DEADLINE", 1.0)
    base = served(TOKEN)
    host, port = base.removeprefix("http://").rsplit(":", 1)
    started = time.monotonic()
    with (
        socket.create_connection((host, int(port)), timeout=10) as connection,
        pytest.raises(OSError),  # the loop ends when the server cuts the connection
    ):
        for byte in b"GET / HTTP/1.0\r\nX-Slow: " + b"a" * 100:
            connection.sendall(bytes([byte]))
            time.sleep(0.2)
            if connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                raise ConnectionResetError("closed by the server")
    assert time.monotonic() - started < 5


def test_connections_are_bounded(served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Over the bound, a connection gets 503 at once; the bound frees as clients go."""
    import gpuenv.cli.dashboard_server as server_module

    monkeypatch.setattr(server_module, "MAX_CONNECTIONS", 3)
    base = served(None)
    host, port = base.removeprefix("http://").rsplit(":", 1)
    idle = [socket.create_connection((host, int(port)), timeout=10) for _ in range(3)]
    try:
        time.sleep(0.3)  # the server has accepted them (each holds a slot)
        answer = raw(base, b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
        assert answer.startswith(b"HTTP/1.0 503") and b"too many connections" in answer
        assert b"X-Content-Type-Options: nosniff" in answer
    finally:
        for connection in idle:
            connection.close()
    deadline = time.monotonic() + 10
    while fetch(base + "/")[0] != 200:  # the slots come back
        assert time.monotonic() < deadline
        time.sleep(0.1)
