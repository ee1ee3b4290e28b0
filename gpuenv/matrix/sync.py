"""`gpuenv matrix sync`: matrix rows from what NGC images say about themselves.

An NGC image's config carries its versions in its environment (``CUDA_VERSION``,
``PYTORCH_BUILD_VERSION``, ``CUDNN_VERSION``, ``NVIDIA_REQUIRE_CUDA``, ...), so a row can be
derived from the registry alone: tags, manifest (or index), config blob, never a layer.
The derivation here is pure; the registry is the `RegistryReader` the caller passes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuenv.common.versions import ComputeCapability, DriverVersion, is_version
from gpuenv.engine.protocol import RegistryReader, UnknownRepository
from gpuenv.errors import PullError
from gpuenv.matrix.model import Matrix
from gpuenv.matrix.overlay import (
    MERGED_FIELDS,
    Disagreement,
    OverlayRow,
    disagreements,
    merge,
)

NGC_PREFIX = "nvcr.io/"
# The framework's version and the NGC release, by framework, as NGC images name them.
VERSION_ENV = {
    "pytorch": ("PYTORCH_BUILD_VERSION", "PYTORCH_VERSION"),
    "tensorflow": ("TENSORFLOW_VERSION",),
    "jax": (),  # no public NGC JAX image shows a JAX version variable: stays unknown
    "none": (),
}
RELEASE_ENV = {"pytorch": "NVIDIA_PYTORCH_VERSION", "tensorflow": "NVIDIA_TENSORFLOW_VERSION"}
IMPORT_NAMES = {"pytorch": "torch", "tensorflow": "tensorflow", "jax": "jax"}


def how_to_record(framework: str) -> str:
    """How a user records a framework version the matrix lacks, for messages.

    >>> how_to_record("pytorch")
    "`gpuenv matrix sync pytorch` reads it from the images' own environment"
    """
    if VERSION_ENV.get(framework):
        return f"`gpuenv matrix sync {framework}` reads it from the images' own environment"
    module = IMPORT_NAMES.get(framework, framework)
    return (
        f"`gpuenv matrix sync {framework}` cannot (NGC {framework} images state no version "
        f"variable): `docker run --rm IMAGE python -c 'import {module}; "
        f"print({module}.__version__)'` says it, for your matrix overlay"
    )


INDEX_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
PREFERRED_PLATFORM = "linux/amd64"
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class Requirement:
    """``NVIDIA_REQUIRE_CUDA`` read as the NVIDIA runtime reads it: clauses separated by
    spaces are alternatives (OR), the terms of a clause separated by commas all hold (AND)."""

    min_cuda: str | None
    branches: tuple[str, ...]


def parse_requirement(text: str) -> Requirement:
    """The CUDA the driver must support, and the data-center branches accepted instead.

    >>> parse_requirement("cuda>=12.4 brand=tesla,driver>=470,driver<471 "
    ...                   "brand=nvidia,driver>=470,driver<471 brand=tesla,driver>=535,driver<536")
    Requirement(min_cuda='12.4', branches=('470', '535'))
    >>> parse_requirement("cuda>=9.0")
    Requirement(min_cuda='9.0', branches=())
    """
    min_cuda = None
    branches: set[int] = set()
    for clause in text.split():
        terms = dict(_term(t) for t in clause.split(",") if _term(t)[0])
        if "cuda>=" in terms and len(terms) == 1:
            min_cuda = terms["cuda>="]
        elif terms.get("brand=") == "tesla" and terms.get("driver>=", "").isdigit():
            branches.add(int(terms["driver>="]))
    return Requirement(min_cuda, tuple(str(b) for b in sorted(branches)))


def _term(term: str) -> tuple[str, str]:
    match = re.match(r"^(cuda>=|brand=|driver>=|driver<)(.+)$", term.strip())
    return (match.group(1), match.group(2)) if match else ("", "")


def environment(config: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """An image config blob's environment and labels, as mappings."""
    inner = config.get("config") or {}
    env = {}
    for item in inner.get("Env") or []:
        name, _, value = str(item).partition("=")
        env[name] = value
    labels = {str(k): str(v) for k, v in (inner.get("Labels") or {}).items()}
    return env, labels


def release_text(version: str, parts: int | None = None) -> str | None:
    """A version as the matrix writes it: ``8.9.7.29+cuda12.2`` -> ``8.9.7.29``; with
    `parts`, its first parts only (``12.8.0.038`` -> ``12.8.0``); None when unreadable."""
    text = version.split("+")[0].strip()
    if not text or not is_version(text):
        return None
    return ".".join(text.split(".")[:parts]) if parts else text


def lowest_compute_capability(arch_list: str) -> str | None:
    """``7.5 8.0 8.6 9.0 10.0 12.0`` -> ``7.5`` (``+PTX`` and ``a`` suffixes ignored).

    >>> lowest_compute_capability("8.0 8.6 9.0 10.0 11.0 12.0+PTX")
    '8.0'
    """
    found = []
    for item in re.split(r"[\s;]+", arch_list.strip()):
        match = re.match(r"^(\d+)\.(\d)", item)
        if match:
            found.append(f"{match.group(1)}.{match.group(2)}")
    return min(found, key=ComputeCapability.parse) if found else None


def derive(
    framework: str,
    repository: str,
    tag: str,
    digest: str,
    platforms: Sequence[str],
    config: Mapping[str, Any],
    toolkit_floor: Callable[[str], DriverVersion | None],
) -> OverlayRow | None:
    """The row an image's config states; None when it carries no NGC metadata.

    `toolkit_floor` maps a CUDA version to its toolkit's minimum driver (the matrix's
    cuda table): ``cuda>=12.4`` in NVIDIA_REQUIRE_CUDA is what the runtime checks. A bound
    below the image's own CUDA (framework images say ``cuda>=9.0`` and rely on their
    compat libraries) states no minimum, so min_driver stays unknown there.
    """
    env, labels = environment(config)
    cuda = release_text(env.get("CUDA_VERSION", ""))
    version = next((env[name] for name in VERSION_ENV.get(framework, ()) if env.get(name)), None)
    if cuda is None and version is None:
        return None
    release = env.get(RELEASE_ENV.get(framework, ""), "") or tag.partition("-")[0]
    requirement = parse_requirement(env.get("NVIDIA_REQUIRE_CUDA", ""))
    min_driver = None
    if requirement.min_cuda and cuda and _minor(requirement.min_cuda) >= _minor(cuda):
        min_driver = toolkit_floor(requirement.min_cuda)
    ubuntu = None
    if labels.get("org.opencontainers.image.ref.name") == "ubuntu":
        ubuntu = release_text(labels.get("org.opencontainers.image.version", ""))
    built_for = env.get("CUDA_DRIVER_VERSION", "")
    lowest = lowest_compute_capability(env.get("CUDA_ARCH_LIST", ""))
    return OverlayRow(
        repository=repository,
        framework=framework,
        tag=tag,
        digest=digest,
        platforms=tuple(platforms),
        release=release if re.match(r"^\d\d\.\d\d$", release) else None,
        framework_version=version.strip() if version and is_version(version.strip()) else None,
        cuda=".".join(cuda.split(".")[:3]) if cuda else None,
        cudnn=release_text(env.get("CUDNN_VERSION", "")),
        nccl=release_text(env.get("NCCL_VERSION", "")),
        ubuntu=ubuntu,
        min_driver=min_driver,
        built_for_driver=_driver(built_for),
        forward_compat=tuple(map(DriverVersion.parse, requirement.branches)) or None,
        min_compute_capability=ComputeCapability.parse(lowest) if lowest else None,
    )


def _driver(text: str) -> DriverVersion | None:
    """A driver version the image states, when it is one."""
    return DriverVersion.parse(text) if re.match(r"^\d+(\.\d+){0,3}$", text) else None


def _minor(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:2])


def platforms_of(document: Mapping[str, Any]) -> list[tuple[str, str]]:
    """An index's (platform, manifest digest) pairs; attestation entries left out.

    >>> platforms_of({"manifests": [
    ...     {"digest": "sha256:a", "platform": {"os": "linux", "architecture": "amd64"}},
    ...     {"digest": "sha256:b", "platform": {"os": "linux", "architecture": "arm64",
    ...                                        "variant": "v8"}},
    ...     {"digest": "sha256:c", "platform": {"os": "unknown", "architecture": "unknown"}}]})
    [('linux/amd64', 'sha256:a'), ('linux/arm64', 'sha256:b')]
    """
    out = []
    for entry in document.get("manifests") or []:
        platform = entry.get("platform") or {}
        name = platform_name(
            platform.get("os"), platform.get("architecture"), platform.get("variant")
        )
        if name:
            out.append((name, str(entry.get("digest", ""))))
    return out


def platform_name(os_name: Any, architecture: Any, variant: Any = None) -> str | None:
    if not os_name or not architecture or "unknown" in (os_name, architecture):
        return None
    name = f"{os_name}/{architecture}"
    return f"{name}/{variant}" if variant and (architecture, variant) != ("arm64", "v8") else name


def tag_shapes(tags: Iterable[str]) -> set[str]:
    """What the matrix's tags look like, digits abstracted: ``24.05-py3`` -> ``#.#-py#``."""
    return {re.sub(r"\d+", "#", tag) for tag in tags}


@dataclass
class SyncReport:
    """What a sync found: the overlay's rows and what they change."""

    rows: list[OverlayRow] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    filled: dict[str, list[str]] = field(default_factory=dict)
    disagreements: list[Disagreement] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    read: int = 0
    reused: int = 0

    def to_data(self) -> dict[str, Any]:
        return {
            "images": len(self.rows),
            "read": self.read,
            "unchanged": self.reused,
            "added": self.added,
            "filled": self.filled,
            "disagreements": [
                {
                    "image": d.image,
                    "field": d.field,
                    "matrix": d.shipped,
                    "image_value": d.from_image,
                    "source": d.source,
                    "digest": d.digest,
                }
                for d in self.disagreements
            ],
            "skipped": self.skipped,
        }


def repositories_of(matrix: Matrix, wanted: Sequence[str] = ()) -> dict[str, str]:
    """The NGC repositories to sync and their frameworks (all of the matrix's by default);
    ``pytorch``, ``nvidia/pytorch`` and ``nvcr.io/nvidia/pytorch`` name the same one."""
    known = {
        row.repository: row.framework
        for row in matrix.images
        if row.repository.startswith(NGC_PREFIX)
    }
    if not wanted:
        return dict(sorted(known.items()))
    out: dict[str, str] = {}
    for name in wanted:
        matches = [r for r in known if r == name or r.endswith("/" + name.removeprefix(NGC_PREFIX))]
        if not matches:
            raise PullError(
                f"'{name}' is not an NGC repository of the matrix",
                hint=f"name one of: {', '.join(r.removeprefix(NGC_PREFIX) for r in sorted(known))}",
            )
        out.update((r, known[r]) for r in matches)
    return out


def sync(
    reader: RegistryReader,
    shipped: Matrix,
    repositories: Mapping[str, str],
    previous: Sequence[OverlayRow] = (),
    progress: Progress | None = None,
) -> SyncReport:
    """Read every tag of `repositories` shaped like the matrix's, derive its row, and
    say what the rows add to, fill in and contradict in the `shipped` matrix. Images whose
    digest is unchanged since `previous` are not read again."""
    report = SyncReport()
    known = {(row.repository, row.tag): row for row in previous}
    report.rows = [row for row in previous if row.repository not in repositories]
    floor = shipped.toolkit_driver
    for repository, framework in repositories.items():
        name = repository.removeprefix(NGC_PREFIX)
        shapes = tag_shapes(row.tag for row in shipped.images if row.repository == repository)
        try:
            tags = [t for t in reader.tags(name) if re.sub(r"\d+", "#", t) in shapes]
        except UnknownRepository:
            report.skipped.append(f"{repository}: not in the registry")
            continue
        for done, tag in enumerate(sorted(tags), start=1):
            if progress:
                progress(done, len(tags), f"{repository}:{tag}")
            row = _read(reader, name, repository, framework, tag, known, floor, report)
            if row is not None:
                report.rows.append(row)
    _compare(report, shipped)
    return report


def _read(
    reader: RegistryReader,
    name: str,
    repository: str,
    framework: str,
    tag: str,
    known: Mapping[tuple[str, str], OverlayRow],
    floor: Callable[[str], DriverVersion | None],
    report: SyncReport,
) -> OverlayRow | None:
    manifest = reader.manifest(name, tag)
    before = known.get((repository, tag))
    if before is not None and before.digest == manifest.digest:
        report.reused += 1
        return before
    if manifest.media_type in INDEX_TYPES:
        pairs = platforms_of(manifest.document)
        if not pairs:
            report.skipped.append(f"{repository}:{tag}: an index without platforms")
            return None
        platforms = [p for p, _ in pairs]
        chosen = dict(pairs).get(PREFERRED_PLATFORM, pairs[0][1])
        config_digest = reader.manifest(name, chosen).document.get("config", {}).get("digest")
    else:
        platforms = []
        config_digest = manifest.document.get("config", {}).get("digest")
    if not config_digest:
        report.skipped.append(f"{repository}:{tag}: a manifest without a config")
        return None
    config = reader.blob(name, str(config_digest))
    if not platforms:
        own = platform_name(config.get("os"), config.get("architecture"), config.get("variant"))
        platforms = [own] if own else []
    report.read += 1
    row = derive(framework, repository, tag, manifest.digest, platforms, config, floor)
    if row is None:
        report.skipped.append(f"{repository}:{tag}: no NGC metadata in its config")
    return row


def _compare(report: SyncReport, shipped: Matrix) -> None:
    merged = merge(shipped, report.rows)
    before = {(row.repository, row.tag): row for row in shipped.images}
    for row in merged.images:
        old = before.get((row.repository, row.tag))
        if old is None:
            report.added.append(row.image)
        elif row is not old:
            changed = [
                n for n in MERGED_FIELDS if getattr(old, n) is None and getattr(row, n) is not None
            ]
            if changed:
                report.filled[row.image] = changed
    report.disagreements = disagreements(merged, report.rows)
