"""Every command through the engine seam on a tcp:// engine (docker-py), not only the
Unix socket: the test engine is reached over a TCP forwarder on loopback that the test
runs itself."""

from __future__ import annotations

import contextlib
import json
import socket
import socketserver
import threading
from collections.abc import Iterator

import pytest

from .conftest import Project, gpuenv_failed

pytestmark = pytest.mark.integration


class _Forward(socketserver.BaseRequestHandler):
    """One TCP connection piped both ways to the engine's Unix socket."""

    unix_path = ""

    def handle(self) -> None:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        upstream.connect(self.unix_path)
        client: socket.socket = self.request

        def pipe(source: socket.socket, target: socket.socket) -> None:
            try:
                while chunk := source.recv(65536):
                    target.sendall(chunk)
            except OSError:
                pass
            finally:
                with contextlib.suppress(OSError):
                    target.shutdown(socket.SHUT_WR)

        back = threading.Thread(target=pipe, args=(upstream, client), daemon=True)
        back.start()
        pipe(client, upstream)
        back.join(timeout=600)
        upstream.close()


class _Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True


@pytest.fixture
def tcp_engine(docker_host: str) -> Iterator[str]:
    handler = type("Forward", (_Forward,), {"unix_path": docker_host.removeprefix("unix://")})
    server = _Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def project(make_project) -> Project:
    made = make_project(spec="gpus: none\n")
    made.ok("build", "-q")
    return made


def test_run_ps_stop_and_doctor_on_a_tcp_engine(project: Project, tcp_engine: str) -> None:
    result = project.gpuenv(
        "run", "--", "sh", "-c", "echo out; echo err >&2; exit 3", DOCKER_HOST=tcp_engine
    )
    assert result.returncode == 3, result.stderr
    assert result.stdout == "out\n"
    assert "err" in result.stderr
    listed = project.ok("ps", "--all", "--json", DOCKER_HOST=tcp_engine)
    assert json.loads(listed.stdout) == []  # the run's container is gone
    doctor = project.gpuenv("doctor", "--json", DOCKER_HOST=tcp_engine)
    checks = {c["name"]: c for c in json.loads(doctor.stdout)}
    assert checks["Docker engine"]["status"] == "ok"
    assert tcp_engine in checks["Docker engine"]["detail"]
    missing = project.gpuenv("stop", "no-such-run", DOCKER_HOST=tcp_engine)
    assert missing.returncode == 2
    assert "no gpuenv run named 'no-such-run'" in missing.stderr


def test_a_refusal_of_a_tcp_engine_is_exit_10_not_a_bug(project: Project, tcp_engine: str) -> None:
    result = project.gpuenv("run", "--memory", "6m", "--", "true", DOCKER_HOST="tcp://127.0.0.1:9")
    assert gpuenv_failed(result, 10), result.stderr
    assert "internal error" not in result.stderr
