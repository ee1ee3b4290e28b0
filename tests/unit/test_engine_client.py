"""The Unix-socket engine client against a real HTTP server on a Unix socket (no Docker
daemon): status handling, bodies (length, chunked), errors in the user's words, and the
attach hijack."""

from __future__ import annotations

import contextlib
import json
import socketserver
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from gpuenv.engine import connect
from gpuenv.engine.api import UnixSocketEngine
from gpuenv.engine.hosts import engine_error
from gpuenv.errors import BuildError, EngineError, EngineRefused


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, str, bytes]] = []  # noqa: RUF012 - shared by the test server
    ping: dict[str, str] | None = None  # the headers /_ping answers with; None: a 500

    def log_message(self, *args: object) -> None:
        del args

    def _reply(self, status: int, body: bytes, chunked: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (body[:5], body[5:]):
                self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def do_GET(self) -> None:
        self.seen.append(("GET", self.path, b""))
        if self.path == "/_ping" and self.ping is not None:
            self.send_response(200)
            for name, value in self.ping.items():
                self.send_header(name, value)
            self.send_header("Content-Length", "2")
            self.end_headers()
            with contextlib.suppress(BrokenPipeError):  # the client reads only the head
                self.wfile.write(b"OK")
        elif self.path.startswith("/v1.41/images/present"):
            self._reply(200, b'{"RepoDigests": ["r@sha256:1"], "Config": {"Labels": {"a": "b"}}}')
        elif self.path.startswith("/v1.41/images/"):
            self._reply(404, b'{"message": "No such image"}')
        elif self.path.startswith("/v1.41/containers/json"):
            self._reply(200, json.dumps([{"Id": "abc", "Names": ["/run-1"]}]).encode(), True)
        elif self.path == "/v1.41/version":
            self._reply(200, b'{"Version": "28.2.2", "ApiVersion": "1.50"}')
        else:
            self._reply(500, b"not json at all")

    def do_POST(self) -> None:
        body = self._body()
        self.seen.append(("POST", self.path, body))
        if self.path.startswith("/v1.41/build?") and b"refuse" in body:
            self._reply(500, b'{"message": "no Dockerfile"}')
        elif self.path.startswith("/v1.41/build?"):
            # As the engine streams it: a JSON object a line, lines split across chunks.
            stream = (
                b'{"stream":"Step 1/2 : FROM base"}\r\n{"stream":"\\n"}\r\n'
                b'{"aux":{"ID":"sha256:feed"}}\r\n\r\n{"stream":"Successfully built feed"}\r\n'
            )
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (stream[:17], stream[17:60], stream[60:]):
                self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        elif self.path == "/v1.41/containers/create":
            self._reply(201, b'{"Id": "c0ffee", "Warnings": []}')
        elif self.path.endswith("/start"):
            self._reply(500, b'{"message": "could not select device driver \\"\\""}')
        elif "/attach?" in self.path:
            self.send_response(101)
            self.send_header("Connection", "Upgrade")
            self.send_header("Upgrade", "tcp")
            self.end_headers()
            self.wfile.write(b"\x01\x00\x00\x00\x00\x00\x00\x02hi")
            self.wfile.flush()
            self.close_connection = True
        elif self.path.endswith("/wait"):
            self._reply(200, b'{"StatusCode": 7}')
        elif self.path.endswith("/wait?condition=next-exit"):
            self._reply(200, b'{"StatusCode": 3}', chunked=True)  # as the engine answers it
        elif self.path.startswith("/v1.41/commit?"):
            self._reply(201, b'{"Id": "sha256:feed"}')
        else:
            self._reply(404, b'{"message": "no such container"}')

    def do_DELETE(self) -> None:
        self.seen.append(("DELETE", self.path, b""))
        if "/containers/busy" in self.path:
            self._reply(409, b'{"message": "removal of container busy is already in progress"}')
        elif "/containers/held" in self.path:
            self._reply(409, b'{"message": "container held is paused, unpause it first"}')
        else:
            self._reply(404, b'{"message": "No such container: gone"}')


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[UnixSocketEngine]:
    path = str(tmp_path / "engine.sock")
    server = _Server(path, _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Handler.seen = []
    _Handler.ping = None
    try:
        yield UnixSocketEngine(f"unix://{path}")
    finally:
        server.shutdown()
        server.server_close()


def test_connect_picks_the_socket_client_for_unix_addresses() -> None:
    assert isinstance(connect("unix:///run/x.sock"), UnixSocketEngine)


def test_json_bodies_and_status(engine: UnixSocketEngine) -> None:
    assert engine.create({"Image": "x"}) == "c0ffee"
    method, path, body = _Handler.seen[-1]
    assert (method, path, json.loads(body)) == ("POST", "/v1.41/containers/create", {"Image": "x"})
    assert engine.version()["Version"] == "28.2.2"
    assert engine.wait("c0ffee") == 7


@pytest.mark.parametrize(
    ("ping", "version", "api", "asked"),
    [
        (
            {"Server": "Docker/20.10.24+dfsg1 (linux)", "Api-Version": "1.41"},
            "20.10.24+dfsg1",
            "1.41",
            False,
        ),
        ({"Server": "Docker/28.2.2 (linux)", "Api-Version": "1.50"}, "28.2.2", "1.50", False),
        ({"Server": "Libpod/4.3.1 (linux)", "Api-Version": "1.41"}, "28.2.2", "1.50", True),
        ({"Server": "Docker/28.2.2 (linux)"}, "28.2.2", "1.50", True),  # no API version
        (None, "28.2.2", "1.50", True),  # /_ping fails
    ],
    ids=["docker-20", "docker-28", "not-docker", "no-api-header", "no-ping"],
)
def test_the_version_comes_from_the_ping_when_it_names_docker(
    engine: UnixSocketEngine, ping: dict[str, str] | None, version: str, api: str, asked: bool
) -> None:
    """Docker answers /version by asking containerd and runc for theirs; /_ping says
    enough, when it says Docker."""
    _Handler.ping = ping
    said = engine.version()
    assert (said["Version"], said["ApiVersion"]) == (version, api)
    assert (("GET", "/v1.41/version", b"") in _Handler.seen) == asked


def test_a_build_streams_the_engines_messages(engine: UnixSocketEngine) -> None:
    events = list(engine.build(b"a tar", "gpuenv/x:1"))
    assert events == [
        {"stream": "Step 1/2 : FROM base"},
        {"stream": "\n"},
        {"aux": {"ID": "sha256:feed"}},
        {"stream": "Successfully built feed"},
    ]
    method, path, body = _Handler.seen[-1]
    assert (method, body) == ("POST", b"a tar")
    assert path.startswith("/v1.41/build?") and "t=gpuenv%2Fx%3A1" in path
    assert "rm=1" in path and "forcerm=1" in path and "pull=0" in path


def test_a_refused_build_is_a_build_error(engine: UnixSocketEngine) -> None:
    with pytest.raises(BuildError, match="refused the build: no Dockerfile"):
        list(engine.build(b"refuse", "gpuenv/x:1"))


def test_the_exit_watch_waits_for_the_next_exit(engine: UnixSocketEngine) -> None:
    watch = engine.watch_exit("c0ffee")
    watch.armed()
    assert watch.code() == 3
    watch.close()
    assert _Handler.seen[-1][:2] == ("POST", "/v1.41/containers/c0ffee/wait?condition=next-exit")


def test_image_config_and_commit(engine: UnixSocketEngine) -> None:
    assert engine.image_config("present:1") == {"Labels": {"a": "b"}}
    assert engine.image_config("absent:1") is None
    assert engine.commit("c0ffee", "gpuenv/demo", "1-u7", {"Labels": {"x": "y"}}) == "sha256:feed"
    method, path, body = _Handler.seen[-1]
    assert method == "POST" and path.startswith("/v1.41/commit?")
    assert "container=c0ffee" in path and "repo=gpuenv%2Fdemo" in path and "tag=1-u7" in path
    assert json.loads(body) == {"Labels": {"x": "y"}}


def test_chunked_bodies_are_read_whole(engine: UnixSocketEngine) -> None:
    assert engine.containers("io.gpuenv.run") == [{"Id": "abc", "Names": ["/run-1"]}]
    _, path, _ = _Handler.seen[-1]
    assert "all=1" in path and "io.gpuenv.run" in path


def test_images(engine: UnixSocketEngine) -> None:
    assert engine.has_image("present:1")
    assert not engine.has_image("absent:1")
    assert engine.repo_digests("present:1") == ["r@sha256:1"]
    assert engine.repo_digests("absent:1") == []


def test_refusals_carry_the_engines_message_and_exit_10(engine: UnixSocketEngine) -> None:
    with pytest.raises(EngineRefused) as refused:
        engine.start("c0ffee")
    assert refused.value.status == 500
    assert "could not select device driver" in refused.value.message
    assert refused.value.exit_code == 10
    with pytest.raises(EngineRefused, match="not json at all"):
        engine.info()


def test_remove_and_kill_of_a_gone_container_are_quiet(engine: UnixSocketEngine) -> None:
    engine.remove("gone")
    engine.kill("gone", "SIGTERM")
    assert [m for m, _, _ in _Handler.seen] == ["DELETE", "POST"]


def test_a_removal_already_under_way_is_a_removal(engine: UnixSocketEngine) -> None:
    """Someone else removing the container (docker rm -f, another run's orphan check)
    removes it all the same; another conflict is an error."""
    engine.remove("busy")
    with pytest.raises(EngineRefused, match="unpause it first"):
        engine.remove("held")


def test_attach_hands_over_the_stream_with_bytes_read_ahead(engine: UnixSocketEngine) -> None:
    stream, ahead = engine.attach("c0ffee", stdin=False)
    try:
        data = ahead
        while len(data) < 10:
            chunk = stream.recv(64)
            if not chunk:
                break
            data += chunk
    finally:
        stream.close()
    assert data == b"\x01\x00\x00\x00\x00\x00\x00\x02hi"


def test_an_engine_that_is_not_there(tmp_path: Path) -> None:
    missing = UnixSocketEngine(f"unix://{tmp_path}/none.sock")
    with pytest.raises(EngineError, match="cannot reach the Docker engine") as error:
        missing.ping()
    assert error.value.exit_code == 10
    assert "DOCKER_HOST" in (error.value.hint or "")


def test_a_socket_without_permission_says_how_to_get_it() -> None:
    error = engine_error(PermissionError(13, "Permission denied"), "unix:///var/run/docker.sock")
    assert error.message == "permission denied on the Docker socket /var/run/docker.sock"
    assert "docker group" in (error.hint or "")


@pytest.mark.parametrize(
    "text",
    [
        "gpuenv/proj:0123abcd",
        "127.0.0.1:5000/nvidia/pytorch@sha256:" + "a" * 64,
        '{"label":["io.gpuenv.run=1"]}',
        "a b+c&d=e/f?g#h%i~j_k.l-m",
        "ünïcödé ✓",
        "",
    ],
)
def test_the_clients_quoting_is_urllibs(text: str) -> None:
    """The client's own percent-encoding (no urllib.parse on the run path) gives what
    urllib.parse gives, and the engine decodes both the same way."""
    import urllib.parse

    from gpuenv.engine.wire import quote, urlencode

    assert quote(text) == urllib.parse.quote(text, safe="")
    query = {"filters": text, "all": 1}
    assert urlencode(query) == urllib.parse.urlencode(query, quote_via=urllib.parse.quote)
    assert urllib.parse.parse_qs(urlencode(query), keep_blank_values=True)["all"] == ["1"]
