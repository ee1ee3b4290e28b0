"""The Docker adapter: the only module that imports docker (docker-py).

Every daemon failure is translated here, in one place, into a gpuenv error that says
what happened and what to do next. docker-py itself is imported lazily: the no-op
build path asks the engine one question over its unix socket without it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from typing import Any

from gpuenv.engine.api import docker_host, engine_error
from gpuenv.engine.protocol import Event, ImageInfo
from gpuenv.errors import BuildError, EngineError, PullError
from gpuenv.images.registry import redact


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

    def images(self, label: str) -> list[ImageInfo]:
        with self._calls():
            rows = self.api.images(filters={"label": label})
        return [
            ImageInfo(
                id=row["Id"],
                tags=tuple(t for t in row.get("RepoTags") or () if t != "<none>:<none>"),
                labels=dict(row.get("Labels") or {}),
                size=int(row.get("Size") or 0),
                created=int(row.get("Created") or 0),
            )
            for row in rows
        ]

    def remove_image(self, reference: str) -> None:
        from docker.errors import APIError

        with self._calls():
            try:
                self.api.remove_image(reference)
            except APIError as exc:
                raise EngineError(f"could not remove {reference}: {_explanation(exc)}") from None


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


def pull_error(
    reference: str, explanation: str, status: int | None = None, verb: str = "pull"
) -> PullError:
    """One message per way a pull (or push) fails: unknown image, refused, unreachable."""
    text = redact(explanation)
    lowered = text.lower()
    refused = ("unauthorized", "denied", "authentication required", "forbidden", "no basic auth")
    if any(word in lowered for word in refused) or status in (401, 403):
        registry = reference.split("/", 1)[0]
        hint = (
            "set NGC_API_KEY to your NGC API key (https://ngc.nvidia.com/setup/api-key)"
            if registry == "nvcr.io"
            else f"log in first: `docker login {registry}`"
        )
        if "does not exist" in lowered or "not found" in lowered:
            return PullError(
                f"{reference} was not found, or {registry} refused access to it: {text}", hint=hint
            )
        return PullError(f"{registry} refused the {verb} of {reference}: {text}", hint=hint)
    if status == 404 or "not found" in lowered or "manifest unknown" in lowered:
        return PullError(
            f"{reference} does not exist in its registry: {text}",
            hint="check the tag (`gpuenv matrix`), or the mirror (GPUENV_REGISTRY_MIRROR)",
        )
    if any(
        word in lowered
        for word in (
            "no such host",
            "connection refused",
            "i/o timeout",
            "dial tcp",
            "timeout",
            "tls",
            "network is unreachable",
        )
    ):
        return PullError(
            f"cannot reach the registry for {reference}: {text}",
            hint="check the network, or pull through a mirror: GPUENV_REGISTRY_MIRROR=host:port",
        )
    return PullError(f"{verb}ing {reference} failed: {text}")
