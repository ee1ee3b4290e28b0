"""A fake container engine for unit tests: it implements the Engine protocol in memory,
records every call, and plays back scripted answers (exit codes, refusals)."""

from __future__ import annotations

import io
import json
import socket
import tarfile
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuenv.engine.protocol import BuildCache, Event, Frame, ImageInfo
from gpuenv.errors import EngineRefused

DIGEST = "sha256:" + "ab" * 32


def _tar(name: str, data: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@dataclass
class FakeEngine:
    exit_code: int = 0
    oom_killed: bool = False
    refuse_start: list[str] = field(default_factory=list)  # messages, one per start
    output: bytes = b""
    calls: list[tuple[str, Any]] = field(default_factory=list)
    created: list[dict[str, Any]] = field(default_factory=list)
    probes: list[dict[str, Any]] = field(default_factory=list)  # containers made to read files
    files: dict[str, bytes] = field(default_factory=dict)  # path -> tar, for get_archive
    alive: set[str] = field(default_factory=set)
    images_present: set[str] = field(default_factory=set)
    listed: list[dict[str, Any]] = field(default_factory=list)
    running: set[str] = field(default_factory=set)  # started and not yet exited
    names_given: dict[str, str] = field(default_factory=dict)  # container -> --name
    version_data: dict[str, Any] = field(
        default_factory=lambda: {"Version": "fake", "ApiVersion": "1.41"}
    )
    info_data: dict[str, Any] = field(default_factory=dict)
    finished_at: str = ""  # Docker's State.FinishedAt of every container, when set
    image_configs: dict[str, dict[str, Any]] = field(default_factory=dict)  # committed ones too
    committed: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # tag, config
    uploaded: dict[str, bytes] = field(default_factory=dict)  # container -> tar
    caches: list[BuildCache] | None = field(default_factory=list)  # None: cannot list (Podman)
    # What install.py --resolve reports in a resolver container (gpuenv.images.resolver):
    # by default nothing to install on a base of no Python distributions.
    resolver_report: dict[str, Any] = field(
        default_factory=lambda: {
            "packages": [],
            "inventory": {"count": 0, "digest": "sha256:" + "0" * 64},
        }
    )
    resolver_files: list[bytes] = field(default_factory=list)  # the tar each resolver got

    endpoint = "unix:///fake/docker.sock"

    def _record(self, name: str, *args: Any) -> None:
        self.calls.append((name, args))

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    # images
    def ping(self) -> None:
        self._record("ping")

    def has_image(self, reference: str) -> bool:
        self._record("has_image", reference)
        return reference in self.images_present or reference.startswith("gpuenv/")

    def image_config(self, reference: str) -> dict[str, Any] | None:
        self._record("image_config", reference)
        if reference in self.image_configs:
            return dict(self.image_configs[reference])
        if reference in self.images_present or reference.startswith("gpuenv/"):
            return {"Labels": {"io.gpuenv.project": "demo"}, "Cmd": ["bash"]}
        return None

    def repo_digests(self, reference: str) -> list[str]:
        """The registry digest of an image it has (pulled ones and gpuenv's); none of an
        image it does not have, as an engine answers (the contract)."""
        if reference not in self.images_present and not reference.startswith("gpuenv/"):
            return []
        repository = reference.rsplit(":", 1)[0]
        return [f"{repository}@{DIGEST}"]

    pull_errors: list[str] = field(default_factory=list)  # the next pulls' error events
    contexts: list[bytes] = field(default_factory=list)  # each build's context, as sent

    def pull(self, repository: str, tag: str, auth: Mapping[str, str] | None) -> Iterator[Event]:
        self._record("pull", repository, tag)
        if self.pull_errors:
            yield {"error": self.pull_errors.pop(0)}
            return
        self.images_present.add(f"{repository}@{DIGEST}")
        yield {"status": f"Digest: {DIGEST}"}

    builder = "buildkit"

    def build(
        self, context: Iterable[bytes], tag: str, *, network: str | None = None
    ) -> Generator[Event, None, None]:
        self._record("build", tag)
        self.contexts.append(b"".join(context))  # as an engine reads it: to its end
        self.images_present.add(tag)
        yield {"stream": "Step 1/1 : FROM base\n"}

    def build_caches(self) -> list[BuildCache] | None:
        return None if self.caches is None else list(self.caches)

    def remove_build_caches(self, ids: Sequence[str]) -> int:
        self._record("remove_build_caches", tuple(ids))
        gone = [cache for cache in self.caches or [] if cache.id in ids]
        self.caches = [cache for cache in self.caches or [] if cache.id not in ids]
        return sum(cache.size for cache in gone)

    def tag(self, source: str, repository: str, tag: str) -> None:
        self._record("tag", source, repository, tag)

    def push(self, repository: str, tag: str, auth: Mapping[str, str] | None) -> Iterator[Event]:
        self._record("push", repository, tag)
        yield {"aux": {"Digest": DIGEST}}

    def images(self, label: str | None = None) -> list[ImageInfo]:
        return []

    def remove_image(self, reference: str) -> None:
        self._record("remove_image", reference)

    def image_users(self, image: str) -> list[str]:
        return []

    # containers
    def version(self) -> dict[str, Any]:
        return dict(self.version_data)

    def info(self) -> dict[str, Any]:
        self._record("info")
        return dict(self.info_data)

    def create(self, config: Mapping[str, Any], name: str | None = None) -> str:
        if (config.get("Labels") or {}).get("io.gpuenv.probe"):
            self.probes.append(dict(config))
            self._record("probe", config["Image"])
            return "probe"
        if (config.get("Labels") or {}).get("io.gpuenv.account"):
            self._record("account", config["Image"])
            return "account"
        if (config.get("Labels") or {}).get("io.gpuenv.resolver"):
            self._record("resolver", config["Image"])
            return "resolver"
        self.created.append(dict(config))
        container = f"c{len(self.created)}"
        self.alive.add(container)
        self.names_given[container] = name or f"run_{container}"
        self._record("create", container)
        return container

    def _known(self, container: str) -> None:
        """As an engine answers for a container it does not have (the contract)."""
        if container not in self.alive and container not in ("probe", "account"):
            raise EngineRefused(404, f"No such container: {container}")

    def start(self, container: str) -> None:
        if container == "resolver":  # the resolver's calls are recorded as one: "resolver"
            return
        self._record("start", container)
        self._known(container)
        if self.refuse_start:
            raise EngineRefused(500, self.refuse_start.pop(0))
        self.running.add(container)

    def kill(self, container: str, signal: str) -> None:
        self._record("kill", container, signal)

    def stop(self, container: str, timeout: int) -> None:
        self._record("stop", container, timeout)

    def remove(self, container: str) -> None:
        if container == "resolver":
            return
        self._record("remove", container)
        self.alive.discard(container)
        self.running.discard(container)

    def exit(self, container: str) -> None:
        """The container's command ends (as a detached run's does, on its own)."""
        self.running.discard(container)

    def inspect(self, container: str) -> dict[str, Any]:
        if container not in self.alive:
            raise EngineRefused(404, f"No such container: {container}")
        index = int(container[1:]) - 1 if container[1:].isdigit() else -1
        config = self.created[index] if 0 <= index < len(self.created) else {}
        return {
            "Name": "/" + self.names_given.get(container, container),
            "Config": {"Labels": config.get("Labels") or {}, "Tty": config.get("Tty", False)},
            "State": {
                "OOMKilled": self.oom_killed,
                "Running": container in self.running,
                "ExitCode": self.exit_code,
                **({"FinishedAt": self.finished_at} if self.finished_at else {}),
            },
        }

    def wait(self, container: str) -> int:
        if container == "resolver":
            return 0
        self._record("wait", container)
        self._known(container)
        self.running.discard(container)
        return self.exit_code

    def resize(self, container: str, rows: int, columns: int) -> None:
        self._record("resize", container)

    def get_archive(self, container: str, path: str) -> bytes | None:
        if container == "resolver":
            return _tar(path.rsplit("/", 1)[-1], json.dumps(self.resolver_report).encode())
        self._record("get_archive", container, path)
        return self.files.get(path)

    def put_archive(self, container: str, path: str, tar: bytes) -> None:
        if container == "resolver":
            self.resolver_files.append(tar)
            return
        self._record("put_archive", container, path)
        self._known(container)
        self.uploaded[container] = tar

    def commit(self, container: str, repository: str, tag: str, config: Mapping[str, Any]) -> str:
        self._record("commit", container, f"{repository}:{tag}")
        self.committed.append((f"{repository}:{tag}", dict(config)))
        self.image_configs[f"{repository}:{tag}"] = {"Labels": dict(config.get("Labels") or {})}
        return "sha256:" + "cd" * 32

    def containers(self, label: str, *, all: bool = True) -> list[dict[str, Any]]:
        self._record("containers", label)
        return list(self.listed)

    def attach(self, container: str, stdin: bool) -> tuple[socket.socket, bytes]:
        """One end of a socket pair; the other sends the scripted output and closes."""
        ours, theirs = socket.socketpair()
        # Multiplexed stdout frame, as the engine sends it without a TTY.
        if self.output:
            theirs.sendall(b"\x01\x00\x00\x00" + len(self.output).to_bytes(4, "big") + self.output)
        theirs.close()
        return ours, b""

    def logs(self, container: str, *, follow: bool, tail: str = "all") -> Iterator[Frame]:
        if container == "resolver":
            return
        self._record("logs", container, follow, tail)
        self._known(container)
        if self.output:
            yield 1, self.output


class _NoView:
    def pull_started(self, reference: str) -> None: ...
    def pull_event(self, progress: object) -> None: ...
    def pull_finished(self, progress: object) -> None: ...


def lock_packages(directory: str, engine: FakeEngine | None = None) -> None:
    """Resolve the Python packages of the project in `directory` as `gpuenv lock` does,
    with a fake engine's resolver (nothing to install, by default): for tests about what
    comes after the lock."""
    from gpuenv.app.overlay import lock_overlay
    from gpuenv.lock.project import load_project

    lock_overlay(load_project(directory, "update"), engine or FakeEngine(), _NoView())
