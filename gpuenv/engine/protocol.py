"""The seam between gpuenv's logic and a container engine (no engine library here).

The core sees only these protocols, the engine's JSON event dicts (which
`images.progress` turns into state) and `EngineRefused` for an error status.
`engine.connect()` gives the implementation: the docker-py adapter (`engine.dockerpy`),
or Podman's (`engine.podman`). Tests use a fake that records the calls.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from gpuenv.errors import PullError

Event = dict[str, Any]
Builder = Literal["buildkit", "buildah", "classic"]
# What a Dockerfile's RUN --mount needs (cache mounts, binds of another stage's files).
MOUNTING_BUILDERS: tuple[Builder, ...] = ("buildkit", "buildah")
Frame = tuple[int, bytes]  # (1: stdout, 2: stderr; a TTY's output is all 1), data


def frames(chunks: Iterable[bytes], tty: bool) -> Iterator[Frame]:
    """A container's output stream as frames. Without a TTY the engine multiplexes:
    [kind, 0, 0, 0, size (4 bytes, big-endian)] + payload (Engine API, "Attach to a
    container": stream format); with one the bytes are the terminal's.

    >>> list(frames([b"\\x02\\0\\0\\0\\0\\0\\0\\x02e", b"r"], tty=False))
    [(2, b'er')]
    """
    buffer = bytearray()
    for chunk in chunks:
        if tty:
            if chunk:
                yield 1, chunk
            continue
        buffer += chunk
        while len(buffer) >= 8:
            size = int.from_bytes(buffer[4:8], "big")
            if len(buffer) < 8 + size:
                break
            yield buffer[0], bytes(buffer[8 : 8 + size])
            del buffer[: 8 + size]


@dataclass(frozen=True)
class ImageInfo:
    id: str
    tags: tuple[str, ...]
    labels: dict[str, str] = field(default_factory=dict)
    size: int = 0
    created: int = 0  # seconds since the epoch

    @classmethod
    def from_summary(cls, row: Mapping[str, Any]) -> ImageInfo:
        """From an Engine API image summary (``GET /images/json``)."""
        return cls(
            id=str(row["Id"]),
            tags=tuple(t for t in row.get("RepoTags") or () if t != "<none>:<none>"),
            labels=dict(row.get("Labels") or {}),
            size=int(row.get("Size") or 0),
            created=int(row.get("Created") or 0),
        )


@dataclass(frozen=True)
class BuildCache:
    """A cache mount's contents kept by the builder (a BuildKit record)."""

    id: str
    description: str  # what mounted it: "cached mount TARGET from exec COMMAND"
    size: int  # bytes
    in_use: bool

    @classmethod
    def from_record(cls, row: Mapping[str, Any]) -> BuildCache:
        """From a ``BuildCache`` entry of the Engine API's ``GET /system/df``."""
        return cls(
            id=str(row["ID"]),
            description=str(row.get("Description") or ""),
            size=int(row.get("Size") or 0),
            in_use=bool(row.get("InUse")),
        )


class Stream(Protocol):
    """A container's attached streams: a connected socket (or socket-like channel)."""

    def recv(self, size: int) -> bytes: ...
    def sendall(self, data: bytes) -> None: ...
    def shutdown(self, how: int) -> None: ...
    def close(self) -> None: ...


class ImageEngine(Protocol):
    """What gpuenv needs from an engine for images."""

    @property
    def endpoint(self) -> str:
        """Where the engine listens, for messages (``unix:///var/run/docker.sock``)."""
        ...

    def ping(self) -> None:
        """Raise EngineError when the engine cannot be reached or used."""

    def has_image(self, reference: str) -> bool: ...

    def image_config(self, reference: str) -> dict[str, Any] | None:
        """A local image's configuration (``Config``: Labels, Cmd, Entrypoint, ...), None
        when the engine does not have it."""
        ...

    def repo_digests(self, reference: str) -> list[str]:
        """``repo@sha256:...`` entries of a local image (empty when unknown)."""
        ...

    def pull(
        self, repository: str, tag: str, auth: Mapping[str, str] | None
    ) -> Iterator[Event]: ...

    @property
    def builder(self) -> Builder:
        """How this engine builds: with BuildKit (Docker), with buildah (Podman), or
        with Docker's classic builder (no cache mounts, no other stages' files)."""
        ...

    def build(
        self, context: Iterable[bytes], tag: str, *, network: str | None = None
    ) -> Generator[Event, None, None]:
        """Build the context's Dockerfile (labels are in it) with this engine's builder
        and tag the result (the context: an uncompressed tar, in chunks, streamed);
        `network` is the network mode of its RUN steps (None: the engine's default)."""
        ...

    def build_caches(self) -> list[BuildCache] | None:
        """The builder's cache mounts (RUN --mount=type=cache); None when the engine
        offers no way to list them (Podman: buildah keeps them in folders on its host)."""
        ...

    def remove_build_caches(self, ids: Sequence[str]) -> int:
        """Remove these cache mounts (unused ones: one in use is left); bytes freed."""
        ...

    def tag(self, source: str, repository: str, tag: str) -> None: ...

    def push(
        self, repository: str, tag: str, auth: Mapping[str, str] | None
    ) -> Iterator[Event]: ...

    def images(self, label: str | None = None) -> list[ImageInfo]:
        """Local images, those carrying `label` when given."""
        ...

    def remove_image(self, reference: str) -> None: ...

    def image_users(self, image: str) -> list[str]:
        """Names of the containers (running or stopped) made from `image`."""
        ...


class ContainerEngine(Protocol):
    """What gpuenv needs from an engine for containers (Engine API shapes: a create
    config is the API's JSON; a listed container is the API's summary dict)."""

    def version(self) -> dict[str, Any]: ...
    def info(self) -> dict[str, Any]: ...

    def create(self, config: Mapping[str, Any], name: str | None = None) -> str:
        """Create a container (named `name`, else the engine picks one); returns its id."""
        ...

    def start(self, container: str) -> None:
        """Raises EngineRefused when the engine will not start it."""

    def kill(self, container: str, signal: str) -> None:
        """Signal the container's command; nothing when it is already gone."""

    def stop(self, container: str, timeout: int) -> None:
        """SIGTERM, then SIGKILL after `timeout` seconds."""

    def remove(self, container: str) -> None:
        """Remove it, forcibly, with its anonymous volumes; nothing when it is gone."""

    def inspect(self, container: str) -> dict[str, Any]: ...

    def wait(self, container: str) -> int:
        """Block until the container is not running (at once when it has already
        exited); its exit code. gpuenv removes its containers itself, so a wait asked
        once the output has ended cannot miss the exit."""
        ...

    def resize(self, container: str, rows: int, columns: int) -> None: ...

    def get_archive(self, container: str, path: str) -> bytes | None:
        """A tar of `path` in the container, None when it does not exist."""
        ...

    def put_archive(self, container: str, path: str, tar: bytes) -> None: ...

    def commit(self, container: str, repository: str, tag: str, config: Mapping[str, Any]) -> str:
        """An image of the container's files as they are now, tagged repository:tag,
        with `config` over the container's; its id."""
        ...

    def containers(self, label: str, *, all: bool = True) -> list[dict[str, Any]]:
        """Containers carrying `label` (stopped ones too unless all=False)."""
        ...

    def attach(self, container: str, stdin: bool) -> tuple[Stream, bytes]:
        """The container's streams (multiplexed unless it has a TTY), and bytes read
        ahead of the first recv."""
        ...

    def logs(self, container: str, *, follow: bool, tail: str = "all") -> Iterator[Frame]:
        """The container's output so far (the last `tail` lines, or all), then, with
        `follow`, as it comes until the container stops."""
        ...


class Engine(ImageEngine, ContainerEngine, Protocol):
    """A whole engine: images and containers."""


@dataclass(frozen=True)
class Manifest:
    """A manifest or index as a registry serves it: its media type, its digest
    (Docker-Content-Digest) and the JSON document."""

    media_type: str
    digest: str
    document: dict[str, Any]


class UnknownRepository(PullError):
    """The registry does not have the repository (a 404 on its tags)."""


class RegistryReader(Protocol):
    """What `gpuenv matrix sync` reads of a registry (the Distribution API): tags,
    manifests and config blobs, never a layer. Failures are PullError."""

    def tags(self, repository: str) -> list[str]:
        """Every tag of `repository` (``nvidia/pytorch``), all pages."""
        ...

    def manifest(self, repository: str, reference: str) -> Manifest:
        """The manifest or index of a tag or digest (OCI and Docker media types)."""
        ...

    def blob(self, repository: str, digest: str) -> dict[str, Any]:
        """A JSON blob (an image config), checked against its digest."""
        ...
