"""`gpuenv dashboard`'s server: who may read the page (a token off loopback), what each
path answers, and the charts it draws. Served on loopback in-process: no daemon."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gpuenv.cli import main
from gpuenv.cli.charts import line_chart
from gpuenv.cli.dashboard import COOKIE, Site, handler_for, read_token
from gpuenv.errors import UsageError

TOKEN = "s3cret-token-of-the-lab"


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

    def serve(token: str | None) -> str:
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(Site(None, "none", token)))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield serve
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
    assert fetch(base + "/", {"Cookie": f"{COOKIE}=wrong"})[0] == 401
    status, headers, _ = fetch(f"{base}/?token={TOKEN}")
    assert status == 303 and headers["Location"] == "/"  # the token leaves the address bar
    cookie = headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert fetch(base + "/", {"Cookie": cookie.split(";")[0]})[0] == 200
    assert fetch(base + "/", {"Authorization": f"Bearer {TOKEN}"})[0] == 200


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
        (0o600, "short\n", "shorter than 16 characters"),
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
