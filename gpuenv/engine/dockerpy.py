"""The Engine protocol over docker-py's low-level APIClient: the one Docker adapter, on
unix://, tcp:// (TLS as DOCKER_TLS_VERIFY and DOCKER_CERT_PATH say) and ssh:// alike,
and the base of Podman's (`engine.podman`).

Every failure of a call is translated in one place, `_calls`: an error status is
`EngineRefused` (or the pull, push, build or tag error it means), an engine that does
not answer is `hosts.engine_error`, which names its address and what to do. Only
docker-py's public API is used; where APIClient has no call that keeps what gpuenv
needs (`logs` keeps which stream each frame came from; Podman's libpod calls), the
request goes through APIClient's own requests.Session methods (`api.get`, `api.post`).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import urllib.parse
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import docker
import docker.errors
import requests

from gpuenv.common import nesting
from gpuenv.engine.failures import pull_error, redact, removal_done
from gpuenv.engine.hosts import docker_host, engine_error
from gpuenv.engine.protocol import BuildCache, Builder, Event, Frame, ImageInfo, Stream, frames
from gpuenv.errors import BuildError, EngineError, EngineRefused, GpuenvError

# Seconds docker-py waits for an answer (or the next part of one): a commit of a large
# container, an image removal or a push can take minutes, as with docker-py before; a
# build, pull or push streams on as long as a part arrives within it. Waits, attached
# streams and followed logs have no limit.
TIMEOUT = 600
# Calls that only look (ping, version, info, inspect, list) answer in milliseconds: an
# engine silent this long is hung or overloaded, and `ps`, `top`, `doctor`, the dashboard
# and the exporter go on without it, saying so. For SILENT_FOR seconds after, this process
# takes it as not answering and does not wait for it again (the dashboard asks every few
# seconds). GPUENV_ENGINE_TIMEOUT sets the seconds (an engine that is slow by nature).
QUICK_TIMEOUT = 5.0
SILENT_FOR = 30.0
_silent: dict[str, float] = {}  # engine address -> when this process asks it again
BUILDKIT_API = (1, 39)  # Docker 18.09: BuildKit through the Engine API's /build
MINIMUM_API = "1.24"  # docker-py's own minimum: enough to ask the engine for its version

T = TypeVar("T")
Refusal = Callable[[int, str], GpuenvError]  # (status, the engine's message) -> the error


class DockerEngine:
    """The Engine protocol for a Docker engine (docker-py's APIClient, streaming calls)."""

    # None: negotiated with the engine (Docker Engine 29 refuses versions below 1.44).
    api_version: str | None = None

    def __init__(self, host: str | None = None) -> None:
        self.host = host or docker_host()
        self._client: Any = None
        self._quick_client: Any = None

    @property
    def api(self) -> Any:
        """docker-py's APIClient, made on first use: negotiating the API version asks the
        engine, and `connect()` talks to none (a command may fail before it needs one,
        or do without: `gpuenv top` shows the GPUs when no engine answers)."""
        if self._client is None:
            with self._calls():
                self._client = self._client_at(self.api_version or self._negotiated())
        return self._client

    @property
    def quick(self) -> Any:
        """docker-py's APIClient for the calls that only look: bounded by QUICK_TIMEOUT,
        and refused at once while this process takes the engine as not answering."""
        until = _silent.get(self.host, 0.0)
        if until > time.monotonic():
            raise self._silence()
        if self._quick_client is None:
            version = self.api.api_version
            with self._calls():
                self._quick_client = self._client_at(version, quick_timeout())
        return self._quick_client

    def _client_at(self, version: str, timeout: float = TIMEOUT) -> Any:
        return docker.APIClient(
            base_url=self.host, version=version, timeout=timeout, tls=_tls(self.host)
        )

    def _negotiated(self) -> str:
        """The engine's API version, as the docker CLI learns it: from `GET /_ping`'s
        Api-Version header (docker-py's "auto" asks GET /version, which Docker answers
        by asking containerd and runc for theirs: 15-30 ms here, on every command)."""
        if _silent.get(self.host, 0.0) > time.monotonic():
            raise self._silence()
        probe = self._client_at(MINIMUM_API)
        answer = self._checked(probe.get(f"{probe.base_url}/_ping", timeout=quick_timeout()))
        return str(answer.headers.get("Api-Version") or MINIMUM_API)

    def _silence(self) -> GpuenvError:
        product, cli = (
            ("Podman service", "podman")
            if "podman" in self.host
            else (
                "Docker engine",
                "docker",
            )
        )
        return EngineError(
            f"the {product} at {self.host} does not answer (nothing within {quick_timeout():g} s)",
            hint=f"it may be hung or overloaded: check it (`{cli} info`, `systemctl status "
            f"{cli}`); GPUENV_ENGINE_TIMEOUT gives a slow engine more seconds",
        )

    @property
    def endpoint(self) -> str:
        return self.host

    @contextlib.contextmanager
    def _calls(self, refused: Refusal = EngineRefused) -> Iterator[None]:
        """The one translation of docker-py's failures: an error status (APIError) is
        `refused(status, message)`, EngineRefused unless a call means something more
        particular, with the engine's address as its hint when it has none; no answer
        at all (a refused connection, a broken one, a timeout, TLS) is the engine error
        that names the address and what to do."""
        try:
            yield
        except docker.errors.APIError as exc:
            status = _status(exc)
            error = refused(status, _explanation(exc))
            error.hint = error.hint or f"refused by the engine at {self.host} (HTTP {status})"
            raise error from None
        except requests.exceptions.ReadTimeout:
            _silent[self.host] = time.monotonic() + SILENT_FOR
            raise self._silence() from None
        except (requests.exceptions.ConnectionError, docker.errors.DockerException, OSError) as exc:
            raise engine_error(exc, self.host) from None

    def _unless_absent(self, call: Callable[[], T]) -> T | None:
        """What `call` answers, None when the engine says its object is not there (404)."""
        with self._calls():
            try:
                return call()
            except docker.errors.NotFound:
                return None

    @staticmethod
    def _checked(response: requests.Response) -> requests.Response:
        """The answer to a request made through APIClient's session (`api.get`,
        `api.post`), its error status raised as docker-py raises it for its own calls
        (an APIError; NotFound for a 404)."""
        try:
            response.raise_for_status()
        except requests.exceptions.HTTPError as exc:
            docker.errors.create_api_error_from_http_exception(exc)  # raises what it makes
        return response

    def _url(self, path: str) -> str:
        """The URL of an Engine API path, versioned as docker-py's own calls are."""
        return f"{self.api.base_url}/v{self.api.api_version}{path}"

    def ping(self) -> None:
        with self._calls():
            self.quick.ping()

    # -- images -------------------------------------------------------------------------

    def _image(self, reference: str) -> dict[str, Any] | None:
        image: dict[str, Any] | None = self._unless_absent(
            lambda: self.quick.inspect_image(reference)
        )
        return image

    def has_image(self, reference: str) -> bool:
        return self._image(reference) is not None

    def image_config(self, reference: str) -> dict[str, Any] | None:
        image = self._image(reference)
        return None if image is None else dict(image.get("Config") or {})

    def repo_digests(self, reference: str) -> list[str]:
        image = self._image(reference) or {}
        return list(image.get("RepoDigests") or [])

    def pull(self, repository: str, tag: str, auth: Mapping[str, str] | None) -> Iterator[Event]:
        reference = f"{repository}@{tag}" if tag.startswith("sha256:") else f"{repository}:{tag}"
        with self._calls(lambda status, text: pull_error(reference, text, status)):
            yield from self.api.pull(
                repository, tag=tag, stream=True, decode=True, auth_config=_auth(auth)
            )

    @property
    def builder(self) -> Builder:
        """BuildKit, through the Engine API (Docker 18.09, API 1.39, and later), else the
        classic builder."""
        version = tuple(int(part) for part in str(self.api.api_version).split(".")[:2])
        return "buildkit" if version >= BUILDKIT_API else "classic"

    def build(
        self, context: Iterable[bytes], tag: str, *, network: str | None = None
    ) -> Generator[Event, None, None]:
        """The context's Dockerfile built by this engine's builder; the engine's messages
        as they come. Closing the iterator (Ctrl-C) closes the request, which cancels a
        BuildKit build."""
        with self._calls(_build_refused):
            if self.builder == "buildkit":
                yield from self._buildkit(context, tag, network)
            else:
                yield from self.api.build(
                    fileobj=iter(context),  # streamed, chunked: never whole in memory
                    custom_context=True,
                    tag=tag,
                    rm=True,
                    forcerm=True,
                    pull=False,
                    network_mode=network,
                    decode=True,
                )

    def _buildkit(self, context: Iterable[bytes], tag: str, network: str | None) -> Iterator[Event]:
        """POST /build?version=2 with the context as the body: BuildKit without a session
        (the engine reads the context from the request, so no docker CLI is needed), its
        progress as `moby.buildkit.trace` messages (`images.buildkit`). docker-py's
        build() has no parameter for the builder version: the request goes through its
        session, with its base URL and API version."""
        params: dict[str, Any] = {"t": tag, "version": "2", "rm": "1", "forcerm": "1"}
        if network:
            params["networkmode"] = network
        response = self._checked(
            self.api.post(
                self._url("/build"),
                params=params,
                data=iter(context),  # streamed, chunked: never whole in memory
                headers={"Content-Type": "application/x-tar"},
                stream=True,
                timeout=None,
            )
        )
        with contextlib.closing(response):
            yield from _json_lines(response.iter_lines())

    def build_caches(self) -> list[BuildCache] | None:
        """BuildKit's cache-mount records, from ``GET /system/df`` (none on the classic
        builder, which has no mounts)."""
        with self._calls():
            rows = self.api.df().get("BuildCache") or []
        return [BuildCache.from_record(row) for row in rows if row.get("Type") == "exec.cachemount"]

    def remove_build_caches(self, ids: Sequence[str]) -> int:
        """``POST /build/prune`` with an id filter, once per record: exactly these
        records (Docker 20.10 takes one value per filter)."""
        freed = 0
        for cache in ids:
            with self._calls(_saying(f"could not remove the build cache {cache}")):
                pruned = self.api.prune_builds(filters={"id": cache})
            freed += int((pruned or {}).get("SpaceReclaimed") or 0)
        return freed

    def tag(self, source: str, repository: str, tag: str) -> None:
        with self._calls(_saying(f"could not tag {source} as {repository}:{tag}")):
            self.api.tag(source, repository, tag=tag)

    def push(self, repository: str, tag: str, auth: Mapping[str, str] | None) -> Iterator[Event]:
        reference = f"{repository}:{tag}"
        with self._calls(lambda status, text: pull_error(reference, text, status, "push")):
            yield from self.api.push(
                repository, tag=tag, stream=True, decode=True, auth_config=_auth(auth)
            )

    def images(self, label: str | None = None) -> list[ImageInfo]:
        with self._calls():
            rows = self.quick.images(filters={"label": label} if label else None)
        return [ImageInfo.from_summary(row) for row in rows]

    def remove_image(self, reference: str) -> None:
        with self._calls(_saying(f"could not remove {reference}")):
            self.api.remove_image(reference)

    def image_users(self, image: str) -> list[str]:
        with self._calls():
            rows = self.quick.containers(all=True, filters={"ancestor": image})
        return [str((row.get("Names") or [row["Id"][:12]])[0]).lstrip("/") for row in rows]

    # -- containers ---------------------------------------------------------------------

    def version(self) -> dict[str, Any]:
        with self._calls():
            return dict(self.quick.version())

    def info(self) -> dict[str, Any]:
        with self._calls():
            return dict(self.quick.info())

    def create(self, config: Mapping[str, Any], name: str | None = None) -> str:
        # The Engine API's own JSON, sent as it is (docker-py builds no config here).
        with self._calls():
            created = self.api.create_container_from_config(dict(config), name)
        return str(created["Id"])

    def start(self, container: str) -> None:
        with self._calls():
            self.api.start(container)

    def kill(self, container: str, signal: str) -> None:
        with contextlib.suppress(EngineRefused), self._calls():  # gone, or not running
            self.api.kill(container, signal=signal)

    def stop(self, container: str, timeout: int) -> None:
        with self._calls():
            self.api.stop(container, timeout=timeout)

    def remove(self, container: str) -> None:
        try:
            with self._calls():
                self.api.remove_container(container, v=True, force=True)
        except EngineRefused as exc:
            if not removal_done(exc):
                raise

    def inspect(self, container: str) -> dict[str, Any]:
        with self._calls():
            return dict(self.quick.inspect_container(container))

    def wait(self, container: str) -> int:
        with self._calls():
            result = self.api.wait(container, timeout=None)
        return int(result.get("StatusCode", 1))

    def resize(self, container: str, rows: int, columns: int) -> None:
        with contextlib.suppress(EngineRefused), self._calls():
            self.api.resize(container, height=rows, width=columns)

    def get_archive(self, container: str, path: str) -> bytes | None:
        def read() -> bytes:
            chunks, _ = self.api.get_archive(container, path)
            return b"".join(chunks)

        return self._unless_absent(read)

    def put_archive(self, container: str, path: str, tar: bytes) -> None:
        with self._calls():
            self.api.put_archive(container, path, tar)

    def commit(self, container: str, repository: str, tag: str, config: Mapping[str, Any]) -> str:
        with self._calls():
            result = self.api.commit(
                container, repository=repository, tag=tag, pause=False, conf=dict(config)
            )
        return str(result["Id"])

    def containers(self, label: str, *, all: bool = True) -> list[dict[str, Any]]:
        with self._calls():
            return list(self.quick.containers(all=all, filters={"label": label}))

    def attach(self, container: str, stdin: bool) -> tuple[Stream, bytes]:
        params = {"stream": 1, "stdout": 1, "stderr": 1, "stdin": 1 if stdin else 0}
        with self._calls():
            answer = self.api.attach_socket(container, params=params)
        # On unix:// and tcp:// docker-py hands over the connection's socket.SocketIO,
        # whose `_sock` (the standard library's attribute, as docker-py's docs and
        # dockerpty use it) is the socket; TLS gives an SSLSocket, ssh:// a channel.
        return getattr(answer, "_sock", answer), b""

    def logs(self, container: str, *, follow: bool, tail: str = "all") -> Iterator[Frame]:
        """GET /containers/{id}/logs through the session: docker-py's logs() drops which
        stream (stdout or stderr) each frame came from, and gpuenv keeps them apart."""
        tty = bool((self.inspect(container).get("Config") or {}).get("Tty"))
        params = {"stdout": 1, "stderr": 1, "follow": int(follow), "tail": tail}
        url = self._url(f"/containers/{_quote(container)}/logs")
        with self._calls():
            response = self._checked(
                self.api.get(url, params=params, stream=True, timeout=None if follow else TIMEOUT)
            )
        try:
            yield from frames(_body(response), tty)
        finally:
            response.close()


def quick_timeout() -> float:
    """QUICK_TIMEOUT, or GPUENV_ENGINE_TIMEOUT's seconds where it names a positive number."""
    try:
        value = float(os.environ.get("GPUENV_ENGINE_TIMEOUT", ""))
    except ValueError:
        return QUICK_TIMEOUT
    return value if 0 < value < 3600 else QUICK_TIMEOUT


def _tls(host: str) -> Any:
    """docker-py's TLSConfig from DOCKER_TLS_VERIFY and DOCKER_CERT_PATH (as the docker
    CLI reads them) for a tcp:// engine; False when they ask for none."""
    if not host.startswith("tcp://"):
        return False
    return docker.utils.kwargs_from_env().get("tls", False)


def _auth(auth: Mapping[str, str] | None) -> dict[str, str] | None:
    return dict(auth) if auth else None


def _saying(what: str) -> Refusal:
    """A refusal worded as what could not be done: ``could not remove X: <message>``."""
    return lambda status, text: EngineRefused(status, f"{what}: {text}")


def _body(response: requests.Response) -> Iterator[bytes]:
    """A streamed body as its chunks come; a connection that breaks ends it (the
    engine went away: the output ends there)."""
    with contextlib.suppress(OSError):
        yield from response.iter_content(chunk_size=None)


def _quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")


def _status(exc: docker.errors.APIError) -> int:
    return int(exc.status_code or 500)


def _explanation(exc: docker.errors.APIError) -> str:
    """The engine's own message (docker-py takes it from the JSON body), the NGC key
    removed (daemon errors echo requests)."""
    text = exc.explanation or str(exc)
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return redact(str(text).strip() or f"HTTP {_status(exc)}")


def _build_refused(status: int, text: str) -> GpuenvError:
    return BuildError(f"the engine refused the build: {text}")


def _json_lines(lines: Iterator[bytes]) -> Iterator[Event]:
    """The engine's build messages, one JSON object a line (a line that is not JSON is
    passed on as build output, as docker-py's decode does not)."""
    for line in lines:
        text = line.strip()
        if not text:
            continue
        try:
            event = nesting.loads(json.loads, text)
        except ValueError:
            event = {"stream": text.decode(errors="replace") + "\n"}
        if isinstance(event, dict):
            yield event
