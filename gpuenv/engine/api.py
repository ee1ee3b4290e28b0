"""The Engine API over its Unix socket, with a small HTTP/1.1 client of its own.

The container calls (`gpuenv run`, ps, stop, doctor) and the image check of the no-op
build are made here directly: docker-py and requests take ~0.2 s to import, more than a
whole `docker run`, and even the standard library's http.client (which pulls in email
and ssl) costs ~40 ms, a sixth of one. The engine's side of the exchange is small and
fixed (one request per connection, a body by Content-Length or chunked, JSON), so
`_exchange` speaks it directly; the attach hijack keeps the connection it upgraded.
Builds are streamed here too (POST /build: ~0.2 s less for every build that has work);
image transfers (pull, push, tag) go through docker-py (`engine.dockerpy`), loaded only
when one is asked for: they need its registry credentials and progress decoding.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Generator, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from gpuenv.engine.failures import removal_done
from gpuenv.engine.hosts import docker_host, engine_error
from gpuenv.engine.protocol import Event, ExitWatch, Frame, ImageInfo, frames
from gpuenv.engine.wire import (
    body_chunks,
    exchange,
    message,
    quote,
    read_body,
    read_head,
    send,
    urlencode,
)
from gpuenv.errors import BuildError, EngineError, EngineRefused

if TYPE_CHECKING:
    from gpuenv.engine.dockerpy import DockerEngine

API = "/v1.41"  # Engine 20.10; DeviceRequests need 1.40


class _ExitWatch:
    """POST /containers/ID/wait?condition=next-exit on a connection of its own. The
    engine registers the wait before it sends the response's head, so once `armed`
    has read the head, an exit cannot be missed; the body comes at the exit."""

    def __init__(self, engine: UnixSocketEngine, container: str) -> None:
        self._host = engine.host
        url = f"{API}/containers/{container}/wait?condition=next-exit"
        try:
            self._sock = send(engine.path, "POST", url, None, {}, None)
        except OSError as exc:
            raise engine_error(exc, self._host) from None
        self._head: tuple[int, dict[str, str], bytes] | None = None

    def armed(self) -> None:
        if self._head is not None:
            return
        try:
            self._head = read_head(self._sock)
            status = self._head[0]
            if status >= 400:
                data = read_body(self._sock, self._head[1], self._head[2])
                raise EngineRefused(status, message(status, data))
        except OSError as exc:
            raise engine_error(exc, self._host) from None

    def code(self) -> int:
        self.armed()
        assert self._head is not None
        try:
            data = read_body(self._sock, self._head[1], self._head[2])
        except OSError as exc:
            raise engine_error(exc, self._host) from None
        finally:
            self._sock.close()
        return int(json.loads(data).get("StatusCode", 1))

    def close(self) -> None:
        self._sock.close()


class UnixSocketEngine:
    """The Engine protocol for an engine on a unix:// socket."""

    def __init__(self, host: str | None = None) -> None:
        self.host = host or docker_host()
        if not self.host.startswith("unix://"):
            raise EngineError(f"not a unix:// engine address: {self.host}")
        self.path = self.host.removeprefix("unix://")
        self._images: DockerEngine | None = None

    @property
    def endpoint(self) -> str:
        return self.host

    # -- HTTP ---------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Mapping[str, Any] | None = None,
        raw: bytes | None = None,
        timeout: float | None = 60,
        content_type: str = "application/json",
        prefix: str = API,
    ) -> tuple[int, bytes]:
        """One request on a fresh connection: its status and whole body."""
        url = prefix + path + (f"?{urlencode(query)}" if query else "")
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        headers = {"Content-Type": content_type} if data is not None else {}
        try:
            return exchange(self.path, method, url, data, headers, timeout)
        except OSError as exc:
            raise engine_error(exc, self.host) from None

    def call(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        """A request whose error status raises EngineRefused; the decoded JSON body."""
        status, data = self.request(method, path, body, **kwargs)
        if status >= 400:
            raise EngineRefused(status, message(status, data))
        if not data:
            return None
        try:
            return json.loads(data)
        except ValueError:
            return data

    # -- containers ---------------------------------------------------------------------

    def version(self) -> dict[str, Any]:
        """The engine's version and API version from ``GET /_ping``'s headers when they
        name a Docker engine (``Server: Docker/20.10.24 (linux)``, ``Api-Version``),
        else ``GET /version``: Docker answers /version by asking containerd and runc for
        theirs (about 9 ms here, on the way to every run's GPUs), /_ping in about 1 ms.
        Only Version, ApiVersion and the component names are read of it."""
        status, headers = self.head("/_ping", prefix="")
        server, api = headers.get("server", ""), headers.get("api-version", "")
        if status == 200 and server.startswith("Docker/") and api:
            engine = server.removeprefix("Docker/").split(" ", 1)[0]
            return {
                "Version": engine,
                "ApiVersion": api,
                "Components": [{"Name": "Engine", "Version": engine}],
            }
        result: dict[str, Any] = self.call("GET", "/version")
        return result

    def info(self) -> dict[str, Any]:
        result: dict[str, Any] = self.call("GET", "/info")
        return result

    def ping(self) -> None:
        self.call("GET", "/_ping")

    def create(self, config: Mapping[str, Any], name: str | None = None) -> str:
        query = {"name": name} if name else None
        return str(self.call("POST", "/containers/create", config, query=query)["Id"])

    def start(self, container: str) -> None:
        self.call("POST", f"/containers/{container}/start")

    def kill(self, container: str, signal: str) -> None:
        with contextlib.suppress(EngineRefused):  # already gone or stopped
            self.call("POST", f"/containers/{container}/kill", query={"signal": signal})

    def stop(self, container: str, timeout: int) -> None:
        self.call(
            "POST", f"/containers/{container}/stop", query={"t": str(timeout)}, timeout=timeout + 50
        )

    def remove(self, container: str) -> None:
        try:
            self.call("DELETE", f"/containers/{container}", query={"force": "1", "v": "1"})
        except EngineRefused as exc:
            if not removal_done(exc):
                raise

    def inspect(self, container: str) -> dict[str, Any]:
        result: dict[str, Any] = self.call("GET", f"/containers/{container}/json")
        return result

    def wait(self, container: str) -> int:
        result = self.call("POST", f"/containers/{container}/wait", timeout=None)
        return int(result.get("StatusCode", 1))

    def watch_exit(self, container: str) -> ExitWatch:
        return _ExitWatch(self, container)

    def resize(self, container: str, rows: int, columns: int) -> None:
        with contextlib.suppress(EngineRefused):
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
            raise EngineRefused(status, message(status, data))

    def commit(self, container: str, repository: str, tag: str, config: Mapping[str, Any]) -> str:
        query = {"container": container, "repo": repository, "tag": tag, "pause": "0"}
        return str(self.call("POST", "/commit", dict(config), query=query)["Id"])

    def containers(self, label: str, *, all: bool = True) -> list[dict[str, Any]]:
        filters = json.dumps({"label": [label]})
        query = {"filters": filters, **({"all": "1"} if all else {})}
        result: list[dict[str, Any]] = self.call("GET", "/containers/json", query=query)
        return result

    def attach(self, container: str, stdin: bool) -> tuple[socket.socket, bytes]:
        """Hijack a connection for the container's streams; returns it and bytes read ahead."""
        query = urlencode({"stream": 1, "stdout": 1, "stderr": 1, "stdin": 1 if stdin else 0})
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
                    raise EngineRefused(500, "the engine closed the attach connection")
                head += chunk
        except OSError as exc:
            sock.close()
            raise engine_error(exc, self.host) from None
        header, _, rest = head.partition(b"\r\n\r\n")
        status = header.split(b"\r\n", 1)[0].split()
        if len(status) < 2 or status[1] not in (b"101", b"200"):
            sock.close()
            detail = message(500, rest) if rest.strip() else header.decode(errors="replace")[:200]
            raise EngineRefused(500, f"attach failed: {detail}")
        return sock, rest

    def logs(self, container: str, *, follow: bool, tail: str = "all") -> Iterator[Frame]:
        """GET /containers/{id}/logs, streamed (chunked) as it comes."""
        tty = bool((self.inspect(container).get("Config") or {}).get("Tty"))
        query = {"stdout": 1, "stderr": 1, "follow": 1 if follow else 0, "tail": tail}
        url = f"{API}/containers/{container}/logs?{urlencode(query)}"
        stream = self._stream("GET", url, None, {}, None if follow else 60)

        def chunks() -> Iterator[bytes]:
            with contextlib.suppress(OSError):  # the engine went away: the output ends
                yield from stream

        try:
            yield from frames(chunks(), tty)
        finally:
            stream.close()

    def _stream(
        self,
        method: str,
        url: str,
        body: bytes | None,
        headers: Mapping[str, str],
        timeout: float | None,
    ) -> Generator[bytes, None, None]:
        """A request on a connection of its own, its body's chunks as they come: an
        error status raises EngineRefused, a failed connection or head the engine's
        error; the connection closes when the stream ends or is closed."""
        try:
            sock = send(self.path, method, url, body, headers, timeout)
        except OSError as exc:
            raise engine_error(exc, self.host) from None
        try:
            try:
                status, response, rest = read_head(sock)
                if status >= 400:
                    data = read_body(sock, response, rest)
                    raise EngineRefused(status, message(status, data))
            except OSError as exc:
                raise engine_error(exc, self.host) from None
            yield from body_chunks(sock, response, rest)
        finally:
            sock.close()

    def head(self, path: str, *, prefix: str = API) -> tuple[int, dict[str, str]]:
        """A GET answered by its status and (lower-cased) headers, the body unread
        (`GET /_ping` says the API versions in its headers)."""
        try:
            sock = send(self.path, "GET", prefix + path, None, {}, 30)
            try:
                status, headers, _ = read_head(sock)
            finally:
                sock.close()
        except OSError as exc:
            raise engine_error(exc, self.host) from None
        return status, headers

    # -- images -------------------------------------------------------------------------

    def has_image(self, reference: str) -> bool:
        status, data = self.request("GET", f"/images/{quote(reference)}/json")
        if status >= 400 and status != 404:
            raise EngineRefused(status, message(status, data))
        return status == 200

    def image_config(self, reference: str) -> dict[str, Any] | None:
        status, data = self.request("GET", f"/images/{quote(reference)}/json")
        if status == 404:
            return None
        if status >= 400:
            raise EngineRefused(status, message(status, data))
        return dict(json.loads(data).get("Config") or {})

    def _docker(self) -> DockerEngine:
        """docker-py, for the streaming image calls; imported on first use."""
        if self._images is None:
            from gpuenv.engine.dockerpy import DockerEngine

            self._images = DockerEngine(self.host)
        return self._images

    def repo_digests(self, reference: str) -> list[str]:
        status, data = self.request("GET", f"/images/{quote(reference)}/json")
        if status != 200:
            return []
        return list(json.loads(data).get("RepoDigests") or [])

    def pull(self, repository: str, tag: str, auth: Mapping[str, str] | None) -> Iterator[Event]:
        return self._docker().pull(repository, tag, auth)

    def build(self, context: bytes, tag: str) -> Iterator[Event]:
        """POST /build with the context as its body (the classic builder, as docker-py
        asks it: the intermediate containers removed, the base not pulled again), and
        the engine's messages, one JSON object a line, as they come."""
        query = {"t": tag, "rm": 1, "forcerm": 1, "pull": 0}
        url = f"{API}/build?{urlencode(query)}"
        headers = {"Content-Type": "application/x-tar"}
        stream = self._stream("POST", url, context, headers, None)  # builds take long
        try:
            pending = b""
            for chunk in stream:
                pending += chunk
                *lines, pending = pending.split(b"\n")
                yield from _events(lines)
            yield from _events([pending])
        except EngineRefused as exc:
            raise BuildError(f"the Docker engine refused the build: {exc.message}") from None
        except OSError as exc:
            raise engine_error(exc, self.host) from None
        finally:
            stream.close()

    def tag(self, source: str, repository: str, tag: str) -> None:
        self._docker().tag(source, repository, tag)

    def push(self, repository: str, tag: str, auth: Mapping[str, str] | None) -> Iterator[Event]:
        return self._docker().push(repository, tag, auth)

    def images(self, label: str | None = None) -> list[ImageInfo]:
        query = {"filters": json.dumps({"label": [label]})} if label else None
        rows: list[dict[str, Any]] = self.call("GET", "/images/json", query=query) or []
        return [ImageInfo.from_summary(row) for row in rows]

    def image_users(self, image: str) -> list[str]:
        filters = json.dumps({"ancestor": [image]})
        rows: list[dict[str, Any]] = self.call(
            "GET", "/containers/json", query={"all": "1", "filters": filters}
        )
        return [str((row.get("Names") or [row["Id"][:12]])[0]).lstrip("/") for row in rows]

    def remove_image(self, reference: str) -> None:
        try:
            self.call("DELETE", f"/images/{quote(reference)}")
        except EngineRefused as exc:
            raise EngineRefused(
                exc.status, f"could not remove {reference}: {exc.message}"
            ) from None


def _events(lines: list[bytes]) -> Iterator[Event]:
    """The build's messages in these lines (blank ones skipped; a line that is not JSON
    is passed on as build output)."""
    for line in lines:
        text = line.strip()
        if not text:
            continue
        try:
            event = json.loads(text)
        except ValueError:
            event = {"stream": text.decode(errors="replace") + "\n"}
        if isinstance(event, dict):
            yield event
