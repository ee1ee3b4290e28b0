"""The docker-py adapter (and Podman's, on it) against a real HTTP server on a Unix
socket (no engine): what each answer of the engine becomes (values, absence, refusals
with their status and message, exit 10), bodies (length, chunked, streamed), the attach
hijack, and an engine that is not there."""

from __future__ import annotations

import json
import os
import socketserver
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import docker.tls
import pytest

from gpuenv.engine.connection import connect
from gpuenv.engine.dockerpy import DockerEngine, _tls
from gpuenv.engine.hosts import engine_error
from gpuenv.engine.podman import PodmanEngine
from gpuenv.errors import BuildError, EngineError, EngineRefused, PullError

API = "/v1.41"
PING = {"Api-Version": "1.41", "Libpod-Api-Version": "4.3.1", "Server": "Libpod/4.3.1 (linux)"}
LOGS = b"\x01\x00\x00\x00\x00\x00\x00\x04out\n\x02\x00\x00\x00\x00\x00\x00\x04err\n"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, str, bytes]] = []  # noqa: RUF012 - shared by the test server
    started = threading.Event()  # the attached container's output comes once it starts

    def log_message(self, *args: object) -> None:
        del args

    def _reply(
        self,
        status: int,
        body: bytes,
        chunked: bool = False,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
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
        if self.headers.get("Transfer-Encoding") == "chunked":  # a streamed build context
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0], 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            self.rfile.readline()
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def do_GET(self) -> None:
        self.seen.append(("GET", self.path, b""))
        path = self.path
        if path in ("/version", f"{API}/version"):
            self._reply(200, b'{"Version": "28.2.2", "ApiVersion": "1.41"}')
        elif path == "/_ping":
            self._reply(200, b"OK", content_type="text/plain", headers=PING)
        elif path.startswith(f"{API}/images/present"):
            self._reply(200, b'{"RepoDigests": ["r@sha256:1"], "Config": {"Labels": {"a": "b"}}}')
        elif path.startswith(f"{API}/images/UPPER"):
            self._reply(400, b'{"message": "invalid reference format: must be lowercase"}')
        elif path.startswith(f"{API}/images/json"):
            summary = {"Id": "sha256:1", "RepoTags": ["docker.io/gpuenv/p:1"], "Size": 3}
            self._reply(200, json.dumps([summary]).encode())
        elif path.startswith(f"{API}/images/"):
            self._reply(404, b'{"message": "No such image"}')
        elif path.startswith(f"{API}/containers/json"):
            self._reply(200, json.dumps([{"Id": "abc", "Names": ["/run-1"]}]).encode(), True)
        elif path == f"{API}/containers/c0ffee/json":
            self._reply(200, b'{"Id": "c0ffee", "Config": {"Tty": false}}')
        elif path.startswith(f"{API}/containers/c0ffee/logs?"):
            self._reply(200, LOGS, chunked=True, content_type="application/octet-stream")
        elif path.startswith(f"{API}/containers/c0ffee/archive?path=%2Fetc%2Fpasswd"):
            self._reply(200, b"a tar", content_type="application/x-tar")
        elif path.startswith(f"{API}/containers/c0ffee/archive?path=%2Fbroken"):
            self._reply(500, b'{"message": "archive: disk I/O error"}')
        elif path.startswith(f"{API}/containers/c0ffee/archive"):
            self._reply(404, b'{"message": "Could not find the file in container c0ffee"}')
        elif path.startswith(f"{API}/containers/gone/json"):
            self._reply(404, b'{"message": "No such container: gone"}')
        elif path.startswith(f"{API}/containers/bad/json"):
            self._reply(400, b'{"message": "invalid container name"}')
        else:
            self._reply(500, b"not json at all")

    def do_POST(self) -> None:
        body = self._body()
        self.seen.append(("POST", self.path, body))
        path = self.path
        if path.startswith(f"{API}/build?") and b"refuse" in body:
            self._reply(500, b'{"message": "no Dockerfile"}')
        elif path.startswith(f"{API}/build?"):
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
        elif path.startswith(f"{API}/images/create?"):
            self._reply(404, b'{"message": "manifest for r/x:nope not found: manifest unknown"}')
        elif path.startswith(f"{API}/images/") and "/tag?" in path:
            self._reply(409, b'{"message": "tag conflict"}')
        elif path.startswith(f"{API}/containers/create"):
            self._reply(201, b'{"Id": "c0ffee", "Warnings": []}')
        elif path == "/v4.0.0/libpod/containers/create":
            self._reply(201, b'{"Id": "pod0", "Warnings": []}')
        elif path == f"{API}/containers/c0ffee/start":
            self.started.set()
            self._reply(204, b"")
        elif path.endswith("/start"):
            self._reply(500, b'{"message": "could not select device driver \\"\\""}')
        elif "/attach?" in path:
            self.send_response(101)
            self.send_header("Connection", "Upgrade")
            self.send_header("Upgrade", "tcp")
            self.end_headers()
            self.wfile.flush()
            self.started.wait(10)  # as an engine: no output before the start
            self.wfile.write(b"\x01\x00\x00\x00\x00\x00\x00\x02hi")
            self.wfile.flush()
            self.close_connection = True
        elif path.endswith("/wait"):
            self._reply(200, b'{"StatusCode": 7}')
        elif path.startswith(f"{API}/commit?"):
            self._reply(201, b'{"Id": "sha256:feed"}')
        else:
            self._reply(404, b'{"message": "no such container"}')

    def do_PUT(self) -> None:
        body = self._body()
        self.seen.append(("PUT", self.path, body))
        if "/containers/c0ffee/archive?" in self.path:
            self._reply(200, b"")
        else:
            self._reply(403, b'{"message": "the container is read-only"}')

    def do_DELETE(self) -> None:
        self.seen.append(("DELETE", self.path, b""))
        if "/containers/busy" in self.path:
            self._reply(409, b'{"message": "removal of container busy is already in progress"}')
        elif "/containers/held" in self.path:
            self._reply(409, b'{"message": "container held is paused, unpause it first"}')
        elif "/images/" in self.path:
            self._reply(409, b'{"message": "image is being used by running container abc"}')
        else:
            self._reply(404, b'{"message": "No such container: gone"}')


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@pytest.fixture
def address(tmp_path: Path) -> Iterator[str]:
    path = str(tmp_path / "engine.sock")
    server = _Server(path, _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Handler.seen = []
    _Handler.started = threading.Event()
    try:
        yield f"unix://{path}"
    finally:
        _Handler.started.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def engine(address: str) -> DockerEngine:
    made = DockerEngine(address)
    assert _Handler.seen == []  # nothing asked until the first call
    assert made.api.api_version == "1.41"
    # The API version, from /_ping's Api-Version header, as the docker CLI learns it.
    assert _Handler.seen == [("GET", "/_ping", b"")]
    _Handler.seen.clear()
    return made


def test_connect_picks_the_docker_adapter(address: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DOCKER_HOST", "CONTAINER_HOST", "GPUENV_ENGINE"):
        monkeypatch.delenv(name, raising=False)
    assert type(connect(address)) is DockerEngine
    assert connect(address).api.api_version == "1.41"


def test_json_bodies_and_status(engine: DockerEngine) -> None:
    assert engine.create({"Image": "x"}) == "c0ffee"
    method, path, body = _Handler.seen[-1]
    assert (method, path, json.loads(body)) == ("POST", f"{API}/containers/create", {"Image": "x"})
    assert engine.create({"Image": "x"}, name="run-1") == "c0ffee"
    assert _Handler.seen[-1][1] == f"{API}/containers/create?name=run-1"
    assert engine.version()["Version"] == "28.2.2"
    assert engine.wait("c0ffee") == 7


def test_a_build_streams_the_engines_messages(engine: DockerEngine) -> None:
    events = list(engine.build([b"a tar"], "gpuenv/x:1"))
    assert events == [
        {"stream": "Step 1/2 : FROM base"},
        {"stream": "\n"},
        {"aux": {"ID": "sha256:feed"}},
        {"stream": "Successfully built feed"},
    ]
    method, path, body = _Handler.seen[-1]
    assert (method, body) == ("POST", b"a tar")
    assert path.startswith(f"{API}/build?") and "t=gpuenv%2Fx%3A1" in path
    # BuildKit (API 1.39 and later), asked through docker-py's session: version=2.
    assert "version=2" in path and "rm=1" in path and "forcerm=1" in path


def test_a_refused_build_is_a_build_error(engine: DockerEngine, address: str) -> None:
    with pytest.raises(BuildError, match="refused the build: no Dockerfile") as refused:
        list(engine.build([b"refuse"], "gpuenv/x:1"))
    assert refused.value.hint == f"refused by the engine at {address} (HTTP 500)"


def test_image_config_and_commit(engine: DockerEngine) -> None:
    assert engine.image_config("present:1") == {"Labels": {"a": "b"}}
    assert engine.image_config("absent:1") is None
    assert engine.commit("c0ffee", "gpuenv/demo", "1-u7", {"Labels": {"x": "y"}}) == "sha256:feed"
    method, path, body = _Handler.seen[-1]
    assert method == "POST" and path.startswith(f"{API}/commit?")
    assert "container=c0ffee" in path and "repo=gpuenv%2Fdemo" in path and "tag=1-u7" in path
    assert json.loads(body) == {"Labels": {"x": "y"}}


def test_chunked_bodies_are_read_whole(engine: DockerEngine) -> None:
    assert engine.containers("io.gpuenv.run") == [{"Id": "abc", "Names": ["/run-1"]}]
    _, path, _ = _Handler.seen[-1]
    assert "all=1" in path and "io.gpuenv.run" in path


def test_images(engine: DockerEngine) -> None:
    assert engine.has_image("present:1")
    assert not engine.has_image("absent:1")
    assert engine.repo_digests("present:1") == ["r@sha256:1"]
    assert engine.repo_digests("absent:1") == []


@pytest.mark.parametrize("call", ["has_image", "image_config", "repo_digests"])
def test_a_reference_the_engine_refuses_is_no_absent_image(engine: DockerEngine, call: str) -> None:
    """A 400 (an invalid reference) is the engine's refusal, exit 10, not "absent"."""
    with pytest.raises(EngineRefused) as refused:
        getattr(engine, call)("UPPER:1")
    assert refused.value.status == 400
    assert refused.value.message == "invalid reference format: must be lowercase"
    assert refused.value.exit_code == 10


def test_refusals_carry_the_engines_message_and_exit_10(engine: DockerEngine) -> None:
    with pytest.raises(EngineRefused) as refused:
        engine.start("nodriver")
    assert refused.value.status == 500
    assert "could not select device driver" in refused.value.message
    assert refused.value.exit_code == 10
    with pytest.raises(EngineRefused, match="not json at all"):
        engine.info()
    with pytest.raises(EngineRefused, match="invalid container name") as inspected:
        engine.inspect("bad")
    assert inspected.value.status == 400
    with pytest.raises(EngineRefused, match="the container is read-only") as put:
        engine.put_archive("other", "/", b"a tar")
    assert put.value.status == 403


def test_image_transfers_say_what_was_refused(engine: DockerEngine) -> None:
    with pytest.raises(PullError, match="r/x:nope does not exist in its registry"):
        list(engine.pull("r/x", "nope", None))
    with pytest.raises(EngineRefused, match="could not tag a:1 as r/x:2: tag conflict"):
        engine.tag("a:1", "r/x", "2")
    with pytest.raises(EngineRefused, match="could not remove a:1: image is being used") as rmi:
        engine.remove_image("a:1")
    assert rmi.value.status == 409


def test_archives(engine: DockerEngine) -> None:
    assert engine.get_archive("c0ffee", "/etc/passwd") == b"a tar"
    assert engine.get_archive("c0ffee", "/absent") is None
    engine.put_archive("c0ffee", "/", b"a tar")
    assert _Handler.seen[-1] == ("PUT", f"{API}/containers/c0ffee/archive?path=%2F", b"a tar")


def test_a_failed_archive_read_is_no_missing_file(engine: DockerEngine) -> None:
    with pytest.raises(EngineRefused, match="disk I/O error") as refused:
        engine.get_archive("c0ffee", "/broken")
    assert refused.value.status == 500


def test_logs_keep_which_stream_each_frame_came_from(engine: DockerEngine) -> None:
    assert list(engine.logs("c0ffee", follow=False, tail="5")) == [(1, b"out\n"), (2, b"err\n")]
    _, path, _ = _Handler.seen[-1]
    assert path.startswith(f"{API}/containers/c0ffee/logs?")
    assert "tail=5" in path and "follow=0" in path and "stderr=1" in path
    with pytest.raises(EngineRefused) as gone:
        list(engine.logs("gone", follow=True))
    assert gone.value.status == 404
    assert gone.value.message == "No such container: gone"


def test_remove_and_kill_of_a_gone_container_are_quiet(engine: DockerEngine) -> None:
    engine.remove("gone")
    engine.kill("gone", "SIGTERM")
    assert [m for m, _, _ in _Handler.seen] == ["DELETE", "POST"]


def test_a_removal_already_under_way_is_a_removal(engine: DockerEngine) -> None:
    """Someone else removing the container (docker rm -f, another run's orphan check)
    removes it all the same; another conflict is an error."""
    engine.remove("busy")
    with pytest.raises(EngineRefused, match="unpause it first"):
        engine.remove("held")


def test_attach_hands_over_the_stream(engine: DockerEngine) -> None:
    stream, ahead = engine.attach("c0ffee", stdin=False)
    try:
        engine.start("c0ffee")
        data = ahead
        while len(data) < 10:
            chunk = stream.recv(64)
            if not chunk:
                break
            data += chunk
    finally:
        stream.close()
    assert data == b"\x01\x00\x00\x00\x00\x00\x00\x02hi"
    assert "stdin=0" in next(p for m, p, _ in _Handler.seen if "/attach?" in p)


def test_podman_asks_no_version_and_creates_through_libpod(address: str) -> None:
    engine = PodmanEngine(address)
    assert engine.version() == {
        "Version": "4.3.1",
        "ApiVersion": "1.41",
        "Components": [{"Name": "Podman Engine", "Version": "4.3.1"}],
        "Rootless": os.getuid() != 0,  # the socket is this user's
    }
    assert engine.create({"Image": "x", "Cmd": ["true"]}, name="run-1") == "pod0"
    assert engine.images()[0].tags == ("gpuenv/p:1",)
    paths = [path for _, path, _ in _Handler.seen]
    assert "/version" not in paths and f"{API}/version" not in paths
    method, _, body = next(s for s in _Handler.seen if "libpod" in s[1])
    spec = json.loads(body)
    assert (method, spec["image"], spec["command"], spec["name"]) == (
        "POST",
        "x",
        ["true"],
        "run-1",
    )


def test_an_engine_that_is_not_there(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="cannot reach the Docker engine") as error:
        DockerEngine(f"unix://{tmp_path}/none.sock").ping()
    assert f"unix://{tmp_path}/none.sock" in error.value.message
    assert error.value.exit_code == 10
    assert "DOCKER_HOST" in (error.value.hint or "")


def test_a_socket_without_permission_says_how_to_get_it() -> None:
    error = engine_error(PermissionError(13, "Permission denied"), "unix:///var/run/docker.sock")
    assert error.message == "permission denied on the Docker socket /var/run/docker.sock"
    assert "docker group" in (error.hint or "")


@pytest.mark.parametrize(
    ("failure", "host", "message", "hint"),
    [
        (
            TimeoutError("UnixHTTPConnectionPool(host='localhost'): Read timed out."),
            "unix:///var/run/docker.sock",
            "the Docker engine at unix:///var/run/docker.sock did not answer in time",
            "`sudo systemctl restart docker`",
        ),
        (
            TimeoutError("Connection to 10.0.0.9 timed out. (connect timeout=600)"),
            "unix:///run/podman/podman.sock",
            "the Podman service at unix:///run/podman/podman.sock did not answer in time",
            "podman.socket",
        ),
        (
            OSError("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed"),
            "tcp://gpu1:2376",
            "TLS with the Docker engine at tcp://gpu1:2376 failed: "
            "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed",
            "DOCKER_CERT_PATH",
        ),
        (
            ConnectionRefusedError(111, "Connection refused"),
            "tcp://gpu1:2376",
            "cannot reach the Docker engine at tcp://gpu1:2376: is it running?",
            "DOCKER_HOST",
        ),
        (
            OSError("alice@gpu1: Permission denied (publickey)."),
            "ssh://alice@gpu1",
            "SSH to the Docker engine at ssh://alice@gpu1 failed: "
            "alice@gpu1: Permission denied (publickey).",
            "ssh-agent",
        ),
        (
            ConnectionRefusedError(111, "ssh: connect to host gpu1 port 22: Connection refused"),
            "ssh://alice@gpu1",
            "cannot reach the Docker engine at ssh://alice@gpu1: is it running?",
            "DOCKER_HOST",
        ),
    ],
    ids=["timeout", "podman-timeout", "tls", "refused", "ssh-key", "ssh-down"],
)
def test_no_answer_is_worded_by_what_happened(
    failure: OSError, host: str, message: str, hint: str
) -> None:
    error = engine_error(failure, host)
    assert (error.message, error.exit_code) == (message, 10)
    assert hint in (error.hint or "")


def test_tls_comes_from_the_docker_clis_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (tmp_path / name).write_text("stand-in\n")
    monkeypatch.setenv("DOCKER_CERT_PATH", str(tmp_path))
    monkeypatch.setenv("DOCKER_TLS_VERIFY", "1")
    tls = _tls("tcp://gpu1:2376")
    assert isinstance(tls, docker.tls.TLSConfig)
    assert (tls.verify, tls.ca_cert) == (True, str(tmp_path / "ca.pem"))
    assert tls.cert == (str(tmp_path / "cert.pem"), str(tmp_path / "key.pem"))
    assert _tls("unix:///var/run/docker.sock") is False
    monkeypatch.delenv("DOCKER_TLS_VERIFY")
    monkeypatch.delenv("DOCKER_CERT_PATH")
    assert _tls("tcp://gpu1:2375") is False


def test_missing_tls_files_are_an_engine_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_CERT_PATH", str(tmp_path))  # no certificates there
    monkeypatch.setenv("DOCKER_TLS_VERIFY", "1")
    with pytest.raises(EngineError) as error:
        DockerEngine("tcp://127.0.0.1:9").ping()
    assert error.value.message.startswith("TLS with the Docker engine at tcp://127.0.0.1:9 failed")
    assert error.value.exit_code == 10
    assert "DOCKER_CERT_PATH" in (error.value.hint or "")
