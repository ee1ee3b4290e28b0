"""Spec + lock -> the Dockerfile and build context of the project image.

Everything is decided here; the templates in images/ngc only get values. User values
(package names, file names) are validated by the spec and reach the Dockerfile only as
JSON strings in exec-form instructions, so no shell ever parses them.

The image tag is content-addressed: a hash of the base digest, the Dockerfile and every
file of the context, whose Python packages are gpuenv.lock's overlay (each `NAME==VERSION
--hash=sha256:...`), never the requirement text: one tag is one set of packages on every
machine. Anything that does not change those (comments in gpuenv.yaml or a requirements
file, the GPUs it asks for) does not change the tag, and a second build finds the image.
"""

from __future__ import annotations

import hashlib
import json
import os
import string
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from gpuenv import __version__
from gpuenv.common.labels import LABEL_PREFIX
from gpuenv.common.resources import data_dir
from gpuenv.engine.protocol import MOUNTING_BUILDERS, Builder
from gpuenv.errors import BuildError, LockError, UsageError
from gpuenv.images.context import ContextFile, project_files
from gpuenv.images.digests import CHUNK, Digests
from gpuenv.images.registry import parse_reference
from gpuenv.lock.lockfile import Lock
from gpuenv.lock.overlay import Overlay
from gpuenv.project.dependencies import InstallPlan, needs_python, plan_install, read_dependencies
from gpuenv.project.spec import Spec

REQUIREMENTS_DIR = "/tmp/gpuenv/requirements"
SUPPORT_DIR = "/usr/local/lib/gpuenv"  # where the templates copy ngc/files, run by every step
UV_VERSION = "0.13.9"  # the uv a build installs (from the project's index), pinned
# ... by the sha256 of its Linux wheels (PyPI's files of uv 0.13.9, manylinux x86_64 and
# aarch64): the installer of every build runs as root, so an index that serves another
# file under its name (dependency confusion on an extra index) is refused.
UV_HASHES = (
    "d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19",
    "5435c5ce14a56431208ca0996416d310f1598e8c2c8ba707688985a16bb82dbe",
)


class _Template(string.Template):
    delimiter = "@"


def _template(name: str) -> _Template:
    return _Template((Path(data_dir("images")) / "ngc" / name).read_text(encoding="utf-8"))


@dataclass(frozen=True)
class BuildPlan:
    dockerfile: str  # what is built: FROM the reference this machine pulled
    canonical_dockerfile: str  # FROM the canonical name: what the tag hashes
    files: tuple[ContextFile, ...]
    tag: str
    labels: dict[str, str] = field(default_factory=dict)
    baked: bool = False
    sources: tuple[str, ...] = ()  # the dependency files the requirements were read from
    uncached: str = ""  # the Dockerfile without cache mounts, when the engine refuses them

    def without_caches(self) -> BuildPlan:
        """The same image built without cache mounts (same tag: same content)."""
        return replace(self, dockerfile=self.uncached or self.dockerfile, uncached="")

    def context(self) -> Iterator[bytes]:
        """The build context as an uncompressed tar, streamed: the Dockerfile, then every
        file, each read from disk in chunks as the engine takes them (memory independent
        of the project's size; a file's one read for the build, `digests`)."""
        for name, data, path, mode, link in self._members():
            info = tarfile.TarInfo(name)
            info.mtime = 0
            info.mode = mode
            if link is not None:
                info.type = tarfile.SYMTYPE
                info.linkname = link
                yield info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
                continue
            if data is not None:
                info.size = len(data)
                yield info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
                yield data + _padding(len(data))
                continue
            assert path is not None
            yield from _file_member(info, path)
        yield b"\0" * (2 * tarfile.BLOCKSIZE)  # the end of the archive

    def write(self, directory: str) -> None:
        """The Dockerfile and every file of the context into `directory` (made; an
        existing one must be empty), for a build elsewhere: `docker buildx build DIR`."""
        os.makedirs(directory, exist_ok=True)
        if os.listdir(directory):
            raise UsageError(
                f"{directory} is not empty: the build context goes into a folder of its own",
                hint="name a new folder, or empty that one",
            )
        with tempfile.TemporaryFile() as spooled:  # on disk: a project may be large
            for chunk in self.context():
                spooled.write(chunk)
            spooled.seek(0)
            with tarfile.open(fileobj=spooled) as archive:
                archive.extractall(directory, filter="data")

    def _members(self) -> Iterator[tuple[str, bytes | None, str | None, int, str | None]]:
        """(name, bytes or None, the file to read or None, mode, link target or None)."""
        yield "Dockerfile", self.dockerfile.encode(), None, 0o644, None
        for item in self.files:
            mode = 0o755 if item.executable else 0o644
            if item.link is not None:
                yield item.name, None, None, mode, item.link
            elif item.data is not None:
                yield item.name, item.data, None, mode, None
            else:
                yield item.name, None, item.path, mode, None


def _padding(size: int) -> bytes:
    return b"\0" * (-size % tarfile.BLOCKSIZE)


def _file_member(info: tarfile.TarInfo, path: str) -> Iterator[bytes]:
    """A file's tar member, read in chunks; a file that changes size while it is read is
    a build error (the archive would not match its header)."""
    with open(path, "rb") as handle:
        info.size = os.fstat(handle.fileno()).st_size
        yield info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
        left = info.size
        while left:
            chunk = handle.read(min(CHUNK, left))
            if not chunk:
                raise BuildError(f"{path} got shorter while it was being copied into the build")
            left -= len(chunk)
            yield chunk
    yield _padding(info.size)


def _json_args(values: Iterable[str]) -> str:
    return ", ".join(json.dumps(value) for value in values)


def base_reference(lock: Lock, pull_repository: str) -> str:
    """The FROM reference: by digest once the lock has one, else by tag."""
    reference = parse_reference(lock.image)
    if lock.digest:
        return f"{pull_repository}@{lock.digest}"
    return f"{pull_repository}:{reference.tag}"


def python_plan(spec: Spec, lock: Lock) -> InstallPlan | None:
    """What the project asks pip for (maybe nothing, when the sources only hold
    comments), or None when the spec names no dependency source: the input of the
    overlay's resolution (`resolve_files`), never of a build.
    SpecError (exit 3) for a source that cannot be read, or Python requirements on an
    image without Python."""
    if not (spec.requirements or spec.packages):
        return None
    python = lock.resolved.get("python")
    python = python if isinstance(python, str) else None
    collected = read_dependencies(spec, python)
    framework = str(lock.resolved.get("framework") or "none")
    version = lock.resolved.get("framework_version")
    plan = plan_install(collected, framework, version if isinstance(version, str) else None, python)
    if not plan.empty:
        needs_python(spec, lock.image, python, framework)
    return plan


def resolve_files(
    plan: InstallPlan, prefer: Iterable[str] = (), exclude_newer: str = ""
) -> dict[str, str]:
    """The files install.py --resolve reads (images/ngc/files/install.py), by name;
    `prefer`: `NAME==VERSION` pins to keep (the lock's, as constraints); `exclude_newer`:
    a UTC time, only files uploaded before it."""
    install = [*plan.options] + [f"{d.line()}  # {d.where}" for d in plan.install]
    return {
        "image.tsv": "".join(f"{pin.line()}\n" for pin in plan.image),
        "install.txt": "".join(f"{line}\n" for line in install),
        "late.txt": "".join(f"{d.line()}  # {d.where}\n" for d in plan.no_isolation),
        "constraints.txt": "".join(f"{d.line()}\n" for d in plan.constraints),
        "prefer.txt": "".join(f"{pin}\n" for pin in prefer),
        "cutoff.txt": f"{exclude_newer}\n" if exclude_newer else "",
    }


def locked_files(overlay: Overlay) -> dict[str, str]:
    """The files install.py --locked reads: what a build installs, exactly the lock."""
    late = overlay.group("late")
    early = [p for p in overlay.packages if p.group != "late"]
    files = {
        "options.txt": "".join(f"{option}\n" for option in overlay.options),
        "overlay.txt": "".join(f"{p.line()}\n" for p in early),
        "overlay-late.txt": "".join(f"{p.line()}\n" for p in late),
    }
    if overlay.paths:
        files["paths.txt"] = "".join(f"{path}\n" for path in overlay.paths)
    return files


def locked_overlay(spec: Spec, lock: Lock) -> Overlay | None:
    """The overlay a build installs; None when the project installs no Python package.
    LockError (exit 5) when the spec has requirements the lock has not resolved yet."""
    if not (spec.requirements or spec.packages):
        return None
    if not lock.overlay.resolved:
        raise LockError(
            f"gpuenv.lock has not resolved the Python packages yet ({lock.overlay.note})",
            hint="run `gpuenv lock` where a container engine runs, then commit gpuenv.lock",
        )
    return lock.overlay if lock.overlay.packages or lock.overlay.paths else None


def support_files() -> list[ContextFile]:
    folder = Path(data_dir("images")) / "ngc" / "files"
    return [
        ContextFile(f"gpuenv/{path.name}", data=path.read_bytes(), executable=True)
        for path in sorted(folder.iterdir())
        if path.is_file()
    ]


@dataclass(frozen=True)
class Caches:
    """The build's cache mounts (BuildKit's and buildah's `RUN --mount`), each named for
    the user who builds (`owner`), so no user installs from what another user's build
    downloaded; none for Docker's classic builder, which has no mounts.

    One cache mount per step: buildah 1.28 (Podman 4.3) unlocks only the last locked mount
    of a step, so a second one would stay locked in Podman's service and hang the next
    build. pip's and uv's caches share one mount (both lock their own files, so builds
    share it); apt's archives and lists share another, locked (apt-get fails, not waits,
    on a lock another build holds)."""

    owner: str | None  # a uid; None: no cache mounts

    def mount(self, name: str, target: str, sharing: str = "shared") -> str:
        if self.owner is None:
            return ""
        return (
            f"--mount=type=cache,id=gpuenv-{name}-{self.owner},target={target},sharing={sharing} "
        )

    @property
    def python(self) -> str:
        """pip's (/root/.cache/pip) and uv's (/root/.cache/uv) downloads and wheels."""
        return self.mount("python", "/root/.cache")

    @property
    def apt(self) -> str:
        """apt's archives, and its package lists below them (apt-install.sh)."""
        return self.mount("apt", "/var/cache/apt", sharing="locked")


CACHED = None  # in a step's arguments: where `--cached` goes when the builder mounts caches


@dataclass(frozen=True)
class Step:
    """One step of the image, as data: its template (images/ngc), the exec-form
    arguments it passes (`CACHED` marks where `--cached` goes when a cache is mounted),
    the cache mount it takes (pip's and uv's, or apt's), and its other fields. The
    Dockerfile a build runs, the one its tag hashes and the one without cache mounts are
    the same steps rendered with other `Caches`."""

    template: str
    arguments: tuple[str | None, ...] | None = None
    cache: Literal["python", "apt"] | None = None  # the cache mount it takes
    fields: tuple[tuple[str, str], ...] = ()

    def render(self, caches: Caches) -> str:
        values = dict(self.fields)
        if self.cache is not None:
            values["mounts"] = caches.python if self.cache == "python" else caches.apt
        if self.arguments is not None:
            mounted = caches.owner is not None
            passed = [
                a if a is not None else "--cached"
                for a in self.arguments
                if a is not None or mounted
            ]
            values["arguments"] = _json_args(passed)
        return _template(self.template).substitute(values)


def image_steps(spec: Spec, overlay: Overlay | None, *, uv: bool, bake: bool) -> list[Step]:
    """The image's steps in the order users change things: the base checked against the
    lock, apt packages, the locked overlay's install, then (with --bake) the project.
    With `uv`, the install step installs uv (from the project's index, by its pinned
    hashes) into the cache mount, or without one for
    itself alone: the image never carries it. (Not a build stage bound into the step:
    Podman 4.3 cannot bind a stage that came from its cache, containers/podman#16281.)"""
    steps: list[Step] = []
    if overlay is not None and overlay.base is not None:
        # First, before apt can add Python packages: the base is the one the packages
        # were resolved on (a re-pushed tag, another image under the name, stop here).
        counted = (str(overlay.base.distributions), overlay.base.inventory)
        steps.append(Step("check.in", counted))
    if spec.apt:
        steps.append(Step("apt.in", (CACHED, *spec.apt), cache="apt"))
    if overlay is not None:
        copied = (
            ("source", json.dumps("requirements/")),
            ("target", json.dumps(f"{REQUIREMENTS_DIR}/")),
        )
        steps.append(Step("copy.in", fields=copied))
        arguments = (REQUIREMENTS_DIR, CACHED, *(["--uv"] if uv else []))
        steps.append(Step("requirements.in", arguments, cache="python"))
    if bake:
        steps.append(Step("bake.in"))
    return steps


def _rendered(steps: list[Step], caches: Caches) -> str:
    return "".join(step.render(caches) for step in steps)


def _dockerfile(base: str, canonical: str, steps: str) -> str:
    return _template("Dockerfile.in").substitute(base=base, canonical=canonical, steps=steps)


def _files(spec: Spec, overlay: Overlay | None, *, uv: bool, bake: bool) -> list[ContextFile]:
    files = support_files()
    if overlay is not None:
        for name, data in locked_files(overlay).items():
            files.append(ContextFile(f"requirements/{name}", data=data.encode()))
        if uv:
            hashes = " ".join(f"--hash=sha256:{h}" for h in UV_HASHES)
            listed = [*overlay.options, f"uv=={UV_VERSION} {hashes}"]
            text = "".join(f"{line}\n" for line in listed)
            files.append(ContextFile("requirements/uv.txt", data=text.encode()))
    if bake:
        files.extend(project_files(spec.project_dir))
    return files


def plan_build(
    spec: Spec,
    lock: Lock,
    *,
    pull_repository: str,
    bake: bool = False,
    lock_digest: str = "",
    builder: Builder = "buildkit",
    cache_owner: int | None = None,
) -> BuildPlan:
    """Everything a build needs, decided: Dockerfile, context files, tag, labels. With a
    builder that mounts (BuildKit, buildah), dependency downloads go to cache mounts
    named for `cache_owner` (default: this process's user) and uv installs the
    requirements unless the spec asks for pip; with the classic builder, pip installs
    them without a cache."""
    mounting = builder in MOUNTING_BUILDERS
    owner = str(os.getuid() if cache_owner is None else cache_owner) if mounting else None
    overlay = locked_overlay(spec, lock)
    uv = mounting and spec.installer == "uv"
    files = _files(spec, overlay, uv=uv, bake=bake)
    reference = parse_reference(lock.image)
    canonical = base_reference(lock, reference.repository)
    base = base_reference(lock, pull_repository)
    steps = image_steps(spec, overlay, uv=uv, bake=bake)
    dockerfile = _dockerfile(base, canonical, _rendered(steps, Caches(owner)))
    # The tag hashes the steps, whoever builds them: not whose caches they mount.
    neutral = _rendered(steps, Caches("USER" if mounting else None))
    canonical_dockerfile = _dockerfile(canonical, canonical, neutral)

    digest = hashlib.sha256(b"gpuenv-image-v1\n" + canonical_dockerfile.encode())
    # Baked files: hashed in chunks, each one only when it changed since the last build.
    known = Digests(spec.project_dir) if bake else None
    for item in sorted(files, key=lambda f: f.name):
        if item.path is not None and item.link is None and known is not None:
            content = known.of(item.path)
        else:
            content = hashlib.sha256(item.content()).hexdigest()
        digest.update(f"\n{item.name}\0{item.executable}\0{item.link}\0{content}".encode())
    if known is not None:
        known.save()
    tag = f"gpuenv/{spec.name}:{digest.hexdigest()[:16]}"
    labels = {
        f"{LABEL_PREFIX}.project": spec.name,
        f"{LABEL_PREFIX}.project-dir": os.path.abspath(spec.project_dir),
        f"{LABEL_PREFIX}.lock": lock_digest,
        f"{LABEL_PREFIX}.version": __version__,
        f"{LABEL_PREFIX}.base": canonical,
        f"{LABEL_PREFIX}.baked": "true" if bake else "false",
    }
    # Labels go last, outside the hash: they describe the image, they are not its content.
    label_lines = _template("labels.in").substitute(labels=_label_arguments(labels))
    uncached = ""
    if mounting:
        uncached = _dockerfile(base, canonical, _rendered(steps, Caches(None))) + label_lines
    sources = tuple(os.path.join(spec.project_dir, f) for f in sorted(lock.requirements))
    return BuildPlan(
        dockerfile + label_lines,
        canonical_dockerfile,
        tuple(files),
        tag,
        labels,
        bake,
        sources,
        uncached,
    )


def label_value(value: str) -> str:
    r"""A LABEL value in double quotes: Docker expands $VAR and reads backslashes there.

    >>> label_value('/home/ann/my "x" $HOME')
    '"/home/ann/my \\"x\\" \\$HOME"'
    """
    cleaned = " ".join(value.splitlines())
    escaped = cleaned.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
    return f'"{escaped}"'


def _label_arguments(labels: dict[str, str]) -> str:
    return " \\\n      ".join(
        f"{key}={label_value(value)}" for key, value in sorted(labels.items())
    )
