"""matrices/*.yaml -> a frozen, validated Matrix (the rows are in `matrix_model`).

The matrix is data we ship and users may replace (GPUENV_MATRIX_DIR), so it is validated
like user input: every problem located, all reported at once. A matrix validated before
is loaded from the user cache instead of parsed again.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from gpuenv.common import cache
from gpuenv.common.checker import Checker

# The model is imported from here too (`as` re-exports it), beside load_matrix.
from gpuenv.common.platforms import PLATFORMS
from gpuenv.common.versions import DriverVersion
from gpuenv.common.yamlfile import Path as YamlPath
from gpuenv.common.yamlfile import YamlDocument, YamlSyntaxError, parse_yaml
from gpuenv.errors import MatrixError, Problem
from gpuenv.matrix import overlay
from gpuenv.matrix.branches import DriverBranch, ForwardSupport, read_branches
from gpuenv.matrix.files import Source as Source
from gpuenv.matrix.files import default_matrix_dir as default_matrix_dir
from gpuenv.matrix.files import matrix_key
from gpuenv.matrix.files import matrix_sources as matrix_sources

# The model is imported from here too (`as` re-exports it), beside load_matrix.
from gpuenv.matrix.model import FRAMEWORK_NAMES as FRAMEWORK_NAMES
from gpuenv.matrix.model import (
    IMAGE_FIELDS,
    OPTIONAL_IMAGE_FIELDS,
    Architecture,
    Companion,
    GpuModel,
    Toolkit,
    matrix_from_data,
    matrix_to_data,
    name_tokens,
)
from gpuenv.matrix.model import ImageRow as ImageRow
from gpuenv.matrix.model import Matrix as Matrix

SCHEMA = 1
EVIDENCE_LEVELS = ("primary", "image", "secondary", "unverified")
GPU_CLASSES = ("datacenter", "workstation", "consumer", "embedded")


def _framework_images(doc: YamlDocument, rows: Checker) -> list[ImageRow]:
    data = doc.data
    framework = _choice(rows, ("framework",), data.get("framework"), tuple(FRAMEWORK_NAMES))
    family = rows.text(("family",), data.get("family"), nullable=False) or "ngc"
    repository = rows.text(("repository",), data.get("repository"), nullable=False) or ""
    images = data.get("images")
    if not isinstance(images, list) or not images:
        rows.add(("images",), "expected a non-empty list of images")
        return []
    out: list[ImageRow] = []
    tags: dict[str, int] = {}
    for index, raw in enumerate(images):
        path: YamlPath = ("images", index)
        entry = rows.mapping(path, raw, IMAGE_FIELDS, OPTIONAL_IMAGE_FIELDS)
        if entry is None:
            continue
        tag = rows.text((*path, "tag"), entry.get("tag"), nullable=False)
        if tag is None:
            continue
        if tag in tags:
            rows.add((*path, "tag"), f"tag '{tag}' is listed twice (first as image {tags[tag]})")
        tags[tag] = index
        out.append(
            _image_row(
                doc,
                rows,
                path,
                entry,
                framework=framework,
                family=family,
                repository=repository,
                tag=tag,
            )
        )
    return out


def _image_row(
    doc: YamlDocument,
    rows: Checker,
    path: YamlPath,
    entry: dict[str, Any],
    *,
    framework: str,
    family: str,
    repository: str,
    tag: str,
) -> ImageRow:
    """The row of one entry of `images`; the framework, family and repository are the
    file's, for all its images."""
    release = _release(rows, (*path, "release"), entry.get("release"))
    unverified = _unverified(rows, (*path, "unverified"), entry.get("unverified", []))
    forward_compat = _forward_compat(
        rows, (*path, "forward_compat"), entry.get("forward_compat", [])
    )
    return ImageRow(
        framework=framework,
        family=family,
        repository=repository,
        tag=tag,
        release=release,
        framework_version=rows.version(
            (*path, "framework_version"), entry.get("framework_version")
        ),
        cuda=rows.version((*path, "cuda"), entry.get("cuda")),
        cudnn=rows.version((*path, "cudnn"), entry.get("cudnn")),
        python=rows.version((*path, "python"), entry.get("python")),
        ubuntu=rows.version((*path, "ubuntu"), entry.get("ubuntu")),
        min_driver=rows.driver((*path, "min_driver"), entry.get("min_driver")),
        forward_compat=forward_compat,
        min_compute_capability=rows.compute_capability(
            (*path, "min_compute_capability"), entry.get("min_compute_capability")
        ),
        evidence=_choice(rows, (*path, "evidence"), entry.get("evidence"), EVIDENCE_LEVELS),
        unverified=unverified,
        note=rows.text((*path, "note"), entry.get("note"), nullable=True) or "",
        source=_where(doc, path),
        platforms=_platforms(rows, path, entry.get("platforms", [])),
        ships=_ships(rows, path, entry.get("ships", {})),
        framework_version_unknown=rows.text(
            (*path, "framework_version_unknown"),
            entry.get("framework_version_unknown"),
            nullable=True,
        )
        or "",
        caveat=rows.text((*path, "caveat"), entry.get("caveat"), nullable=True) or "",
    )


def _release(rows: Checker, path: YamlPath, value: Any) -> str | None:
    """An NGC release (YY.MM), or None."""
    release = rows.text(path, value, nullable=True)
    if release is not None and not re.match(r"^\d\d\.\d\d$", release):
        rows.add(path, f"'{release}' is not an NGC release (YY.MM)")
        return None
    return release


def _unverified(rows: Checker, path: YamlPath, value: Any) -> tuple[str, ...]:
    """The fields of the row no source confirms (each must be a field of an image row)."""
    unverified = rows.text_list(path, value)
    for name in unverified:
        if name not in (*IMAGE_FIELDS, *OPTIONAL_IMAGE_FIELDS):
            rows.add(path, f"'{name}' is not a field of an image row")
    return unverified


def _forward_compat(rows: Checker, path: YamlPath, value: Any) -> tuple[DriverVersion, ...]:
    """The driver branches the image runs on through CUDA forward compatibility."""
    drivers = (
        rows.driver((*path, i), d, nullable=False)
        for i, d in enumerate(rows.text_list(path, value))
    )
    return tuple(d for d in drivers if d)


def _choice(rows: Checker, path: YamlPath, value: Any, choices: tuple[str, ...]) -> str:
    """One of `choices`; the last stands in for a wrong one (the problem is recorded,
    and the matrix is refused once every file is read)."""
    return rows.choice(path, value, choices) or choices[-1]


def _platforms(rows: Checker, path: YamlPath, value: Any) -> tuple[str, ...]:
    listed = rows.text_list((*path, "platforms"), value)
    for bad in (p for p in listed if p not in PLATFORMS):
        rows.add((*path, "platforms"), f"'{bad}' is not one of {', '.join(PLATFORMS)}")
    return tuple(p for p in listed if p in PLATFORMS)


def _ships(rows: Checker, path: YamlPath, value: Any) -> tuple[tuple[str, ...], ...]:
    """``ships: {torchvision: 0.20.0a0+afc54f7}`` -> (name, version) pairs (names normalized)."""
    if not isinstance(value, dict):
        rows.add((*path, "ships"), "expected a mapping of package: version")
        return ()
    out = []
    for name, version in value.items():
        text = rows.version((*path, "ships", str(name)), version)
        if text is not None:
            out.append((canonicalize_name(str(name)), text))
    return tuple(sorted(out))


def _where(doc: YamlDocument, path: YamlPath) -> str:
    position = doc.position(path)
    name = os.path.basename(doc.filename)
    return f"{name}:{position.line}" if position else name


def _cuda(
    doc: YamlDocument, rows: Checker
) -> tuple[list[tuple[int, DriverVersion]], list[Toolkit], list[Architecture]]:
    data = doc.data
    compat: list[tuple[int, DriverVersion]] = []
    for index, raw in enumerate(data.get("minor_version_compat") or []):
        path: YamlPath = ("minor_version_compat", index)
        entry = rows.mapping(path, raw, ("major", "min_driver", "evidence", "note"))
        if entry is None:
            continue
        major = entry.get("major")
        driver = rows.driver((*path, "min_driver"), entry.get("min_driver"), nullable=False)
        _choice(rows, (*path, "evidence"), entry.get("evidence"), EVIDENCE_LEVELS)
        if not isinstance(major, int) or isinstance(major, bool):
            rows.add((*path, "major"), "expected a CUDA major version number")
        elif driver:
            compat.append((major, driver))
    toolkits: list[Toolkit] = []
    for index, raw in enumerate(data.get("toolkits") or []):
        path = ("toolkits", index)
        entry = rows.mapping(path, raw, ("version", "label", "min_driver", "evidence", "note"))
        if entry is None:
            continue
        version = rows.version((*path, "version"), entry.get("version"), nullable=False)
        driver = rows.driver((*path, "min_driver"), entry.get("min_driver"), nullable=False)
        label = rows.text((*path, "label"), entry.get("label"), nullable=False)
        evidence = _choice(rows, (*path, "evidence"), entry.get("evidence"), EVIDENCE_LEVELS)
        if version and driver and label:
            toolkits.append(Toolkit(version, label, driver, evidence))
    architectures: list[Architecture] = []
    fields = "compute_capability architecture added_in removed_in evidence note"
    for index, raw in enumerate(data.get("compute_capabilities") or []):
        path = ("compute_capabilities", index)
        entry = rows.mapping(path, raw, fields.split(), optional=("min_driver", "last_branch"))
        if entry is None:
            continue
        cc = rows.compute_capability(
            (*path, "compute_capability"), entry.get("compute_capability"), nullable=False
        )
        arch = rows.text((*path, "architecture"), entry.get("architecture"), nullable=False)
        added = rows.version((*path, "added_in"), entry.get("added_in"))
        removed = rows.version((*path, "removed_in"), entry.get("removed_in"))
        floor = rows.driver((*path, "min_driver"), entry.get("min_driver"))
        last = rows.driver((*path, "last_branch"), entry.get("last_branch"))
        evidence = _choice(rows, (*path, "evidence"), entry.get("evidence"), EVIDENCE_LEVELS)
        if cc and arch:
            architectures.append(Architecture(cc, arch, added, removed, evidence, floor, last))
    if not compat or not toolkits or not architectures:
        rows.add((), "needs minor_version_compat, toolkits and compute_capabilities")
    return compat, toolkits, architectures


def _gpus(doc: YamlDocument, rows: Checker) -> list[GpuModel]:
    out: list[GpuModel] = []
    seen: dict[tuple[str, ...], str] = {}
    fields = "name match compute_capability class architecture evidence note"
    models = doc.data.get("models")
    if not isinstance(models, list) or not models:
        rows.add(("models",), "expected a non-empty list of GPU models")
        return out
    for index, raw in enumerate(models):
        path: YamlPath = ("models", index)
        entry = rows.mapping(path, raw, fields.split(), optional=("min_driver",))
        if entry is None:
            continue
        name = rows.text((*path, "name"), entry.get("name"), nullable=False)
        match = [name_tokens(m) for m in rows.text_list((*path, "match"), entry.get("match"))]
        cc = rows.compute_capability(
            (*path, "compute_capability"), entry.get("compute_capability"), nullable=False
        )
        gpu_class = _choice(rows, (*path, "class"), entry.get("class"), GPU_CLASSES)
        arch = rows.text((*path, "architecture"), entry.get("architecture"), nullable=False)
        floor = rows.driver((*path, "min_driver"), entry.get("min_driver"))
        evidence = _choice(rows, (*path, "evidence"), entry.get("evidence"), EVIDENCE_LEVELS)
        if not match:
            rows.add((*path, "match"), "needs at least one name to match")
        for sequence in match:
            if sequence in seen:
                rows.add((*path, "match"), f"'{' '.join(sequence)}' also matches {seen[sequence]}")
            seen[sequence] = name or "?"
        if name and cc and arch:
            out.append(GpuModel(name, tuple(match), cc, gpu_class, arch, evidence, floor))
    return out


def load_matrix(directory: str | None = None, *, with_overlay: bool = True) -> Matrix:
    """Load and validate every matrices/*.yaml, and the user's overlay over them (see
    `overlay`); raise MatrixError listing all problems.

    A matrix validated before comes from the user cache (see `cache`), keyed by the
    files' names and bytes and the code that validates them; only valid matrices are
    stored, so problems are always found and located by a fresh parse.
    """
    directory = directory or default_matrix_dir()
    key, sources, extra = matrix_key(directory, with_overlay=with_overlay)
    stored = cache.load("matrix", key)
    if stored is not None:
        try:
            return matrix_from_data(stored, directory)
        except (TypeError, ValueError):
            pass
    matrix = overlay.apply(validate_matrix(directory, sources), extra)
    cache.store("matrix", key, matrix_to_data(matrix))
    return matrix


@dataclass(frozen=True)
class _MatrixParts:
    """What the matrix files hold, gathered file by file."""

    images: list[ImageRow] = field(default_factory=list)
    compat: list[tuple[int, DriverVersion]] = field(default_factory=list)
    toolkits: list[Toolkit] = field(default_factory=list)
    architectures: list[Architecture] = field(default_factory=list)
    gpus: list[GpuModel] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    notices: list[tuple[str, str]] = field(default_factory=list)
    companions: list[Companion] = field(default_factory=list)
    branches: list[DriverBranch] = field(default_factory=list)
    forward_support: list[ForwardSupport] = field(default_factory=list)


def validate_matrix(directory: str, sources: Sequence[Source]) -> Matrix:
    """Parse and validate the matrix files; raise MatrixError listing all problems."""
    problems: list[Problem] = []
    digest = hashlib.sha256()
    parts = _MatrixParts()
    for source in sources:
        digest.update(source.name.encode() + b"\0" + source.data)
        rows = _schema_checked(source, problems)
        if rows is not None:
            _read_matrix_file(rows, parts)
    if not problems and not (parts.images and parts.toolkits and parts.gpus):
        problems.append(
            Problem(directory, None, None, None, "needs framework-images, cuda and gpus files")
        )
    if problems:
        raise MatrixError(
            problems,
            hint="fix the file named above, or unset GPUENV_MATRIX_DIR"
            if os.environ.get("GPUENV_MATRIX_DIR")
            else "gpuenv's own matrix files are damaged: reinstall gpuenv "
            "(`pip install --force-reinstall gpuenv`)",
        )
    parts.images.sort(key=ImageRow.sort_key, reverse=True)
    version = f"{max(parts.updated)}+{digest.hexdigest()[:12]}"
    return Matrix(
        images=tuple(parts.images),
        minor_compat=tuple(sorted(parts.compat)),
        toolkits=tuple(parts.toolkits),
        architectures=tuple(parts.architectures),
        gpus=tuple(parts.gpus),
        version=version,
        directory=directory,
        notices=tuple(parts.notices),
        companions=tuple(parts.companions),
        branches=tuple(parts.branches),
        forward_support=tuple(parts.forward_support),
    )


def _schema_checked(source: Source, problems: list[Problem]) -> Checker | None:
    """The checker of one matrix file, if it parses as a mapping of the schema this
    gpuenv reads; None (the problem recorded) if not."""
    try:
        doc = parse_yaml(source.data.decode("utf-8", errors="replace"), source.path)
    except YamlSyntaxError as exc:
        problems.append(exc.problem)
        return None
    rows = Checker(doc, problems)
    if not isinstance(doc.data, dict):
        rows.add((), "expected a mapping with schema, kind and data")
        return None
    if doc.data.get("schema") != SCHEMA:
        rows.add(
            ("schema",),
            f"schema {doc.data.get('schema')!r} is not supported "
            f"(this gpuenv reads schema {SCHEMA})",
        )
        return None
    return rows


def _read_matrix_file(rows: Checker, parts: _MatrixParts) -> None:
    """Add what one file holds, by its kind, to `parts`."""
    doc = rows.doc
    date = rows.text(("updated",), doc.data.get("updated"), nullable=False)
    if date:
        parts.updated.append(date)
    kind = doc.data.get("kind")
    if kind == "framework-images":
        parts.images.extend(_framework_images(doc, rows))
        notice = rows.text(("notice",), doc.data.get("notice"), nullable=True)
        if notice and isinstance(doc.data.get("framework"), str):
            parts.notices.append((doc.data["framework"], " ".join(notice.split())))
    elif kind == "cuda":
        compat, toolkits, architectures = _cuda(doc, rows)
        parts.compat.extend(compat)
        parts.toolkits.extend(toolkits)
        parts.architectures.extend(architectures)
    elif kind == "gpus":
        parts.gpus.extend(_gpus(doc, rows))
    elif kind == "companions":
        parts.companions.extend(_companions(doc, rows))
    elif kind == "driver-branches":
        branches, support = read_branches(doc.data, rows, EVIDENCE_LEVELS)
        parts.branches.extend(branches)
        parts.forward_support.extend(support)
    else:
        kinds = "framework-images, cuda, gpus, companions, driver-branches"
        rows.add(("kind",), f"{kind!r} is not one of {kinds}")


def _companions(doc: YamlDocument, rows: Checker) -> list[Companion]:
    """Companion releases and the framework version their own metadata requires."""
    out: list[Companion] = []
    items = doc.data.get("companions")
    if not isinstance(items, list):
        rows.add(("companions",), "expected a list of companion releases")
        return out
    for index, raw in enumerate(items):
        path: YamlPath = ("companions", index)
        entry = rows.mapping(path, raw, ("package", "version", "requires", "source"))
        if entry is None:
            continue
        package = rows.text((*path, "package"), entry.get("package"), nullable=False)
        version = rows.version((*path, "version"), entry.get("version"), nullable=False)
        requires = rows.text((*path, "requires"), entry.get("requires"), nullable=True)
        source = rows.text((*path, "source"), entry.get("source"), nullable=False)
        if requires is not None:
            try:
                Requirement(requires)
            except InvalidRequirement:
                rows.add((*path, "requires"), f"'{requires}' is not a requirement")
                requires = None
        if package and version and source:
            out.append(Companion(package, version, requires, source))
    return out
