"""The Docker Engine API over its unix socket, for the hot paths: `gpuenv run` and the
no-op build. Part of the Docker adapter with `docker_engine` (docker-py, used for pulls
and builds): docker-py and requests take ~0.2 s to import, more than a whole
`docker run`, so the calls a run needs are made here directly, in JSON over HTTP/1.1.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import urllib.parse
from collections.abc import Mapping
from typing import Any

from gpuenv.errors import EngineError, GpuenvError

DEFAULT_HOST = "unix:///var/run/docker.sock"
API = "/v1.41"  # Engine 20.10; DeviceRequests need 1.40


def docker_host(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get("DOCKER_HOST") or DEFAULT_HOST


def not_running(host: str) -> EngineError:
    return EngineError(
        f"cannot reach the Docker engine at {host}: is it running?",
        hint="start it (`sudo systemctl start docker`, or `sudo dockerd &`), "
        "or point DOCKER_HOST at a running engine",
    )


def engine_error(exc: BaseException, host: str) -> GpuenvError:
    """The one translation of "cannot talk to the engine" into what to do next."""
    text = str(exc)
    if isinstance(exc, PermissionError) or "Permission denied" in text:
        where = host.removeprefix("unix://")
        return EngineError(
            f"permission denied on the Docker socket {where}",
            hint="add yourself to the docker group (`sudo usermod -aG docker $USER`, then log "
            "in again), or use rootless Docker",
        )
    return not_running(host)


def image_exists_fast(reference: str, host: str | None = None) -> bool | None:
    """Whether the engine has `reference`: one HTTP/1.0 request, the status line only.

    None when this cannot be answered that way (a tcp:// or ssh:// engine, any error):
    the caller then asks through a client that explains failures.
    """
    host = host or docker_host()
    if not host.startswith("unix://"):
        return None
    path = f"/images/{urllib.parse.quote(reference, safe='')}/json"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(host.removeprefix("unix://"))
            sock.sendall(f"GET {path} HTTP/1.0\r\nHost: docker\r\n\r\n".encode())
            head = sock.recv(64).split(b"\r\n", 1)[0].split()
    except OSError:
        return None
    status = head[1] if len(head) >= 2 else b""
    if status == b"200":
        return True
    if status == b"404":
        return False
    return None


class ApiError(GpuenvError):
    """The engine answered a request with an error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _read_response(sock: socket.socket) -> tuple[int, bytes]:
    """Status and body of one HTTP/1.1 response (Content-Length, chunked, or until close)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise OSError("the engine closed the connection")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {
        k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])
    }
    if "content-length" in headers:
        size = int(headers["content-length"])
        while len(body) < size:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
        return status, body[:size]
    if headers.get("transfer-encoding", "").lower() == "chunked":
        decoded = b""
        while True:
            while b"\r\n" not in body:
                chunk = sock.recv(65536)
                if not chunk:
                    return status, decoded
                body += chunk
            size_line, _, body = body.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            while len(body) < size + 2:
                chunk = sock.recv(65536)
                if not chunk:
                    return status, decoded + body[:size]
                body += chunk
            if size == 0:
                return status, decoded
            decoded += body[:size]
            body = body[size + 2 :]
    if status in (204, 304) or 100 <= status < 200:
        return status, b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return status, body
        body += chunk


class EngineAPI:
    """Just the Engine API calls a run needs."""

    def __init__(self, host: str | None = None) -> None:
        self.host = host or docker_host()
        if not self.host.startswith("unix://"):
            raise EngineError(
                f"gpuenv run talks to engines on a unix socket; DOCKER_HOST is {self.host}",
                hint="run gpuenv on the Docker host, or forward its socket (ssh -L)",
            )
        self.path = self.host.removeprefix("unix://")

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Mapping[str, Any] | None = None,
        raw: bytes | None = None,
        timeout: float | None = 60,
        content_type: str = "application/json",
    ) -> tuple[int, bytes]:
        url = API + path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else b"")
        head = f"{method} {url} HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n"
        if data or method in ("POST", "PUT"):
            head += f"Content-Type: {content_type}\r\nContent-Length: {len(data)}\r\n"
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(timeout)
                sock.connect(self.path)
                sock.sendall(head.encode() + b"\r\n" + data)
                return _read_response(sock)
        except (OSError, ValueError, IndexError) as exc:
            raise engine_error(exc, self.host) from None

    def call(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        status, data = self.request(method, path, body, **kwargs)
        if status >= 400:
            try:
                message = json.loads(data).get("message", "")
            except (ValueError, AttributeError):
                message = data.decode(errors="replace")
            raise ApiError(status, str(message).strip() or f"HTTP {status}")
        if not data:
            return None
        try:
            return json.loads(data)
        except ValueError:
            return data

    def image_exists(self, reference: str) -> bool:
        status, _ = self.request("GET", f"/images/{urllib.parse.quote(reference, safe='')}/json")
        return status == 200

    def create(self, config: Mapping[str, Any]) -> str:
        return str(self.call("POST", "/containers/create", config)["Id"])

    def start(self, container: str) -> None:
        self.call("POST", f"/containers/{container}/start")

    def kill(self, container: str, signal: str) -> None:
        with contextlib.suppress(ApiError):  # already gone or stopped: nothing to signal
            self.call("POST", f"/containers/{container}/kill", query={"signal": signal})

    def remove(self, container: str) -> None:
        try:
            self.call("DELETE", f"/containers/{container}", query={"force": "1", "v": "1"})
        except ApiError as exc:
            if exc.status != 404:
                raise

    def inspect(self, container: str) -> dict[str, Any]:
        result: dict[str, Any] = self.call("GET", f"/containers/{container}/json")
        return result

    def wait(self, container: str) -> int:
        result = self.call("POST", f"/containers/{container}/wait", timeout=None)
        return int(result.get("StatusCode", 1))

    def resize(self, container: str, rows: int, columns: int) -> None:
        with contextlib.suppress(ApiError):
            self.call("POST", f"/containers/{container}/resize", query={"h": rows, "w": columns})

    def get_archive(self, container: str, path: str) -> bytes | None:
        status, data = self.request("GET", f"/containers/{container}/archive", query={"path": path})
        return data if status == 200 else None

    def put_archive(self, container: str, path: str, tar: bytes) -> None:
        status, data = self.request(
            "PUT",
            f"/containers/{container}/archive",
            query={"path": path},
            raw=tar,
            content_type="application/x-tar",
        )
        if status >= 400:
            raise ApiError(status, data.decode(errors="replace"))

    def containers(self, label: str) -> list[dict[str, Any]]:
        filters = json.dumps({"label": [label]})
        result: list[dict[str, Any]] = self.call(
            "GET", "/containers/json", query={"all": "1", "filters": filters}
        )
        return result

    def attach(self, container: str, stdin: bool) -> tuple[socket.socket, bytes]:
        """Hijack a connection for the container's streams; returns it and bytes read ahead."""
        query = urllib.parse.urlencode(
            {"stream": 1, "stdout": 1, "stderr": 1, "stdin": 1 if stdin else 0}
        )
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.path)
            sock.sendall(
                f"POST {API}/containers/{container}/attach?{query} HTTP/1.1\r\n"
                "Host: docker\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n"
                "Content-Length: 0\r\n\r\n".encode()
            )
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = sock.recv(4096)
                if not chunk:
                    raise ApiError(500, "the engine closed the attach connection")
                head += chunk
        except OSError as exc:
            sock.close()
            raise engine_error(exc, self.host) from None
        header, _, rest = head.partition(b"\r\n\r\n")
        status = header.split(b"\r\n", 1)[0].split()
        if len(status) < 2 or status[1] not in (b"101", b"200"):
            sock.close()
            raise ApiError(500, f"attach failed: {header.decode(errors='replace')[:200]}")
        return sock, rest
