"""The Engine protocol over docker-py: the only module that imports docker.

Used for image transfers and builds on every engine, and for everything on engines
the Unix-socket client cannot reach (tcp://, ssh://). Every daemon failure is
translated here, in one place, into a gpuenv error that says what happened and what to
do next. docker-py itself is imported when an instance is made, never at import.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from typing import Any

from gpuenv.engine.failures import pull_error, redact, removal_done
from gpuenv.engine.hosts import docker_host, engine_error
from gpuenv.engine.protocol import Event, Frame, ImageInfo, WaitAfter, frames
from gpuenv.errors import BuildError, EngineError, EngineRefused


class DockerEngine:
    """The Engine protocol over docker-py's low-level APIClient (streaming calls)."""

    def __init__(self, host: str | None = None) -> None:
        self._host = host or docker_host()
        try:
            import docker
            from docker.errors import DockerException
        except ImportError as exc:  # pragma: no cover - a dependency of gpuenv
            raise EngineError(f"the docker Python package is missing: {exc}") from None
        self._docker = docker
        try:
            self.api = docker.APIClient(base_url=self._host, version="auto", timeout=600)
        except DockerException as exc:
            raise engine_error(exc, self._host) from None
        except OSError as exc:
            raise engine_error(exc, self._host) from None

    @property
    def endpoint(self) -> str:
        return self._host

    @contextlib.contextmanager
    def _calls(self) -> Iterator[None]:
        from docker.errors import APIError, DockerException
        from requests.exceptions import ConnectionError as RequestsConnectionError

        try:
            yield
        except APIError:
            raise
        except (RequestsConnectionError, DockerException, OSError) as exc:
            raise engine_error(exc, self._host) from None

    def ping(self) -> None:
        with self._calls():
            self.api.ping()

    def has_image(self, reference: str) -> bool:
        from docker.errors import ImageNotFound, NotFound

        with self._calls():
            try:
                self.api.inspect_image(reference)
            except (ImageNotFound, NotFound):
                return False
        return True

    def repo_digests(self, reference: str) -> list[str]:
        from docker.errors import ImageNotFound, NotFound

        with self._calls():
            try:
                data = self.api.inspect_image(reference)
            except (ImageNotFound, NotFound):
                return []
        return list(data.get("RepoDigests") or [])

    def image_config(self, reference: str) -> dict[str, Any] | None:
        from docker.errors import ImageNotFound, NotFound

        with self._calls():
            try:
                data = self.api.inspect_image(reference)
            except (ImageNotFound, NotFound):
                return None
        return dict(data.get("Config") or {})

    def pull(self, repository: str, tag: str, auth: Mapping[str, str] | None) -> Iterator[Event]:
        from docker.errors import APIError

        reference = f"{repository}@{tag}" if tag.startswith("sha256:") else f"{repository}:{tag}"
        try:
            with self._calls():
                stream = self.api.pull(
                    repository,
                    tag=tag,
                    stream=True,
                    decode=True,
                    auth_config=dict(auth) if auth else None,
                )
                yield from stream
        except APIError as exc:
            raise pull_error(
                reference, _explanation(exc), getattr(exc, "status_code", None)
            ) from None

    def build(self, context: bytes, tag: str) -> Iterator[Event]:
        from docker.errors import APIError

        try:
            with self._calls():
                yield from self.api.build(
                    fileobj=_Reader(context),
                    custom_context=True,
                    tag=tag,
                    rm=True,
                    forcerm=True,
                    decode=True,
                    pull=False,
                )
        except APIError as exc:
            raise BuildError(f"the Docker engine refused the build: {_explanation(exc)}") from None

    def tag(self, source: str, repository: str, tag: str) -> None:
        from docker.errors import APIError

        with self._calls():
            try:
                self.api.tag(source, repository, tag=tag)
            except APIError as exc:
                raise EngineError(
                    f"could not tag {source} as {repository}:{tag}: {_explanation(exc)}"
                ) from None

    def push(self, repository: str, tag: str, auth: Mapping[str, str] | None) -> Iterator[Event]:
        from docker.errors import APIError

        try:
            with self._calls():
                yield from self.api.push(
                    repository,
                    tag=tag,
                    stream=True,
                    decode=True,
                    auth_config=dict(auth) if auth else None,
                )
        except APIError as exc:
            status = getattr(exc, "status_code", None)
            raise pull_error(f"{repository}:{tag}", _explanation(exc), status, "push") from None

    def images(self, label: str | None = None) -> list[ImageInfo]:
        with self._calls():
            rows = self.api.images(filters={"label": label} if label else None)
        return [ImageInfo.from_summary(row) for row in rows]

    def remove_image(self, reference: str) -> None:
        from docker.errors import APIError

        with self._calls():
            try:
                self.api.remove_image(reference)
            except APIError as exc:
                raise EngineRefused(
                    _status(exc), f"could not remove {reference}: {_explanation(exc)}"
                ) from None

    def image_users(self, image: str) -> list[str]:
        with self._calls():
            rows = self.api.containers(all=True, filters={"ancestor": image})
        return [str((row.get("Names") or [row["Id"][:12]])[0]).lstrip("/") for row in rows]

    # -- containers (engines the Unix-socket client cannot reach) -------------------------

    @contextlib.contextmanager
    def _container_calls(self) -> Iterator[None]:
        from docker.errors import APIError

        with self._calls():
            try:
                yield
            except APIError as exc:
                raise EngineRefused(_status(exc), _explanation(exc)) from None

    def version(self) -> dict[str, Any]:
        with self._container_calls():
            result: dict[str, Any] = self.api.version()
        return result

    def info(self) -> dict[str, Any]:
        with self._container_calls():
            result: dict[str, Any] = self.api.info()
        return result

    def create(self, config: Mapping[str, Any], name: str | None = None) -> str:
        # The API's own JSON, as the Unix-socket client sends it: no docker-py translation.
        with self._container_calls():
            url = self.api._url("/containers/create")
            params = {"name": name} if name else None
            response = self.api._post_json(url, data=dict(config), params=params)
            result = self.api._result(response, True)
        return str(result["Id"])

    def start(self, container: str) -> None:
        with self._container_calls():
            self.api.start(container)

    def kill(self, container: str, signal: str) -> None:
        with contextlib.suppress(EngineRefused), self._container_calls():
            self.api.kill(container, signal=signal)

    def stop(self, container: str, timeout: int) -> None:
        with self._container_calls():
            self.api.stop(container, timeout=timeout)

    def remove(self, container: str) -> None:
        try:
            with self._container_calls():
                self.api.remove_container(container, v=True, force=True)
        except EngineRefused as exc:
            if not removal_done(exc):
                raise

    def inspect(self, container: str) -> dict[str, Any]:
        with self._container_calls():
            result: dict[str, Any] = self.api.inspect_container(container)
        return result

    def wait(self, container: str) -> int:
        with self._container_calls():
            result = self.api.wait(container, timeout=None)
        return int(result.get("StatusCode", 1))

    def watch_exit(self, container: str) -> WaitAfter:
        return WaitAfter(self, container)

    def resize(self, container: str, rows: int, columns: int) -> None:
        with contextlib.suppress(EngineRefused), self._container_calls():
            self.api.resize(container, height=rows, width=columns)

    def get_archive(self, container: str, path: str) -> bytes | None:
        from docker.errors import NotFound

        with self._calls():
            try:
                stream, _ = self.api.get_archive(container, path)
            except NotFound:
                return None
            return b"".join(stream)

    def put_archive(self, container: str, path: str, tar: bytes) -> None:
        with self._container_calls():
            self.api.put_archive(container, path, tar)

    def commit(self, container: str, repository: str, tag: str, config: Mapping[str, Any]) -> str:
        with self._container_calls():
            result = self.api.commit(
                container, repository=repository, tag=tag, pause=False, conf=dict(config)
            )
        return str(result["Id"])

    def containers(self, label: str, *, all: bool = True) -> list[dict[str, Any]]:
        with self._container_calls():
            result: list[dict[str, Any]] = self.api.containers(all=all, filters={"label": label})
        return result

    def attach(self, container: str, stdin: bool) -> tuple[Any, bytes]:
        params = {"stream": 1, "stdout": 1, "stderr": 1, "stdin": 1 if stdin else 0}
        with self._container_calls():
            sock = self.api.attach_socket(container, params=params)
        # A raw socket over tcp://; ssh:// gives a socket-like channel.
        return getattr(sock, "_sock", sock), b""

    def logs(self, container: str, *, follow: bool, tail: str = "all") -> Iterator[Frame]:
        # docker-py's logs() drops which stream a frame came from: read the body as
        # its _multiplexed_response_stream_helper does (response.raw: urllib3 undoes
        # the chunked encoding), and keep each frame's kind.
        with self._container_calls():
            tty = bool((self.api.inspect_container(container).get("Config") or {}).get("Tty"))
            params = {"stdout": 1, "stderr": 1, "follow": 1 if follow else 0, "tail": tail}
            url = self.api._url("/containers/{0}/logs", container)
            response = self.api._get(url, params=params, stream=True)
            self.api._raise_for_status(response)
        self.api._disable_socket_timeout(self.api._get_raw_response_socket(response))
        raw = response.raw

        def chunks() -> Iterator[bytes]:
            while True:
                if tty:
                    chunk = raw.read1(65536)
                else:
                    chunk = raw.read(8)
                    if len(chunk) == 8:
                        chunk += raw.read(int.from_bytes(chunk[4:8], "big"))
                if not chunk:
                    return
                yield chunk

        try:
            yield from frames(chunks(), tty)
        finally:
            response.close()


def _status(exc: Any) -> int:
    return int(getattr(exc, "status_code", None) or 500)


class _Reader:
    """A file-like view of bytes for docker-py's streaming upload."""

    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)
        self._offset = 0

    def read(self, size: int = -1) -> bytes:
        end = len(self._data) if size < 0 else self._offset + size
        chunk = bytes(self._data[self._offset : end])
        self._offset += len(chunk)
        return chunk


def _explanation(exc: Any) -> str:
    text = getattr(exc, "explanation", None) or str(exc)
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    with contextlib.suppress(ValueError, TypeError):
        text = json.loads(text).get("message", text)
    return redact(str(text).strip())
