"""The seam between gpuenv's logic and a container engine (no docker import here).

`docker_engine.DockerEngine` implements it with docker-py; the core only sees this
protocol and the engine's JSON event dicts, which `progress` turns into state.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

Event = dict[str, Any]


@dataclass(frozen=True)
class ImageInfo:
    id: str
    tags: tuple[str, ...]
    labels: dict[str, str] = field(default_factory=dict)
    size: int = 0
    created: int = 0  # seconds since the epoch


class Engine(Protocol):
    """What gpuenv needs from a container engine."""

    @property
    def endpoint(self) -> str:
        """Where the engine listens, for messages (``unix:///var/run/docker.sock``)."""
        ...

    def ping(self) -> None:
        """Raise EngineError when the engine cannot be reached or used."""

    def has_image(self, reference: str) -> bool: ...

    def repo_digests(self, reference: str) -> list[str]:
        """``repo@sha256:...`` entries of a local image (empty when unknown)."""
        ...

    def pull(
        self, repository: str, tag: str, auth: Mapping[str, str] | None
    ) -> Iterator[Event]: ...

    def build(self, context: bytes, tag: str) -> Iterator[Event]:
        """Build the context's Dockerfile (labels are in it) and tag the result."""
        ...

    def tag(self, source: str, repository: str, tag: str) -> None: ...

    def push(
        self, repository: str, tag: str, auth: Mapping[str, str] | None
    ) -> Iterator[Event]: ...

    def images(self, label: str) -> list[ImageInfo]:
        """Local images carrying `label`."""
        ...

    def remove_image(self, reference: str) -> None: ...
