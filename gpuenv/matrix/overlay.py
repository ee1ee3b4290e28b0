"""The user's matrix overlay: rows `gpuenv matrix sync` derived from NGC images' own
metadata, merged over the shipped matrix.

The overlay never overwrites: a tag the shipped matrix lacks becomes a row of evidence
``image``; a shipped field that is unknown (null) is filled from the image; a shipped
value the image contradicts is kept and reported (`disagreements`). The file is per user
(GPUENV_DATA_DIR, else the user data folder), written atomically, and validated like the
shipped files: a damaged overlay is a located MatrixError that says how to fix it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from gpuenv.common.checker import Checker
from gpuenv.common.dirs import make_user_dir
from gpuenv.common.files import atomic_write
from gpuenv.common.platforms import PLATFORMS
from gpuenv.common.versions import ComputeCapability, DriverVersion, as_written
from gpuenv.common.yamlfile import Path as YamlPath
from gpuenv.common.yamlfile import YamlSyntaxError, parse_yaml
from gpuenv.errors import MatrixError, Problem
from gpuenv.matrix.files import FILENAME as FILENAME
from gpuenv.matrix.files import key_parts as key_parts
from gpuenv.matrix.files import overlay_path as overlay_path
from gpuenv.matrix.files import read_source as read_source
from gpuenv.matrix.model import FRAMEWORK_NAMES, ImageRow, Matrix

SCHEMA = 1
KIND = "image-overlay"
# What the image states, in the order of the file; `fields` of a row are these.
VERSION_FIELDS = ("release", "framework_version", "cuda", "cudnn", "nccl", "ubuntu")
DRIVER_FIELDS = ("min_driver", "built_for_driver")
ROW_FIELDS = (
    "repository",
    "framework",
    "tag",
    "digest",
    "platforms",
    *VERSION_FIELDS,
    *DRIVER_FIELDS,
    "forward_compat",
    "min_compute_capability",
)
# Shipped fields an image can fill when they are null, or contradict when they are not.
MERGED_FIELDS = (
    "release",
    "framework_version",
    "cuda",
    "cudnn",
    "ubuntu",
    "min_driver",
    "min_compute_capability",
)


@dataclass(frozen=True)
class OverlayRow:
    """What one image's config says about it (None: it does not say)."""

    repository: str
    framework: str
    tag: str
    digest: str
    platforms: tuple[str, ...]
    release: str | None = None
    framework_version: str | None = None
    cuda: str | None = None
    cudnn: str | None = None
    nccl: str | None = None
    ubuntu: str | None = None
    min_driver: DriverVersion | None = None
    built_for_driver: DriverVersion | None = None
    forward_compat: tuple[DriverVersion, ...] | None = None
    min_compute_capability: ComputeCapability | None = None

    @property
    def image(self) -> str:
        return f"{self.repository}:{self.tag}"

    def to_data(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["platforms"] = list(self.platforms)
        for name in ("min_driver", "built_for_driver", "min_compute_capability"):
            data[name] = as_written(getattr(self, name))
        if self.forward_compat is not None:
            data["forward_compat"] = [str(driver) for driver in self.forward_compat]
        return {name: data[name] for name in ROW_FIELDS}


@dataclass(frozen=True)
class Disagreement:
    """A shipped value the image contradicts: kept, and shown to the user."""

    image: str
    field: str
    shipped: str
    from_image: str
    source: str
    digest: str

    def __str__(self) -> str:
        return (
            f"{self.image}: {self.field} is {self.shipped} in the matrix ({self.source}), "
            f"{self.from_image} in the image ({self.digest[:19]}…); the matrix value is kept"
        )


def _broken(problems: list[Problem], path: str) -> MatrixError:
    return MatrixError(
        problems,
        hint=f"run `gpuenv matrix sync` again to rewrite it, or delete {path} "
        "(the shipped matrix stays)",
    )


def parse_rows(data: bytes, path: str) -> tuple[OverlayRow, ...]:
    """The overlay's rows, validated; MatrixError listing every problem with its line."""
    try:
        doc = parse_yaml(data.decode("utf-8", errors="replace"), path)
    except YamlSyntaxError as exc:
        raise _broken([exc.problem], path) from None
    check = Checker(doc)
    rows: list[OverlayRow] = []
    top = doc.data if isinstance(doc.data, dict) else {}
    if not top or top.get("schema") != SCHEMA or top.get("kind") != KIND:
        check.add((), f"expected schema: {SCHEMA} and kind: {KIND}")
    images = top.get("images", [])
    if not isinstance(images, list):
        check.add(("images",), "expected a list of images")
        images = []
    seen: set[tuple[str, str]] = set()
    for index, raw in enumerate(images):
        row = _row(check, ("images", index), raw)
        if row is not None:
            if (row.repository, row.tag) in seen:
                check.add(("images", index, "tag"), "listed twice")
            seen.add((row.repository, row.tag))
            rows.append(row)
    if check.problems:
        raise _broken(check.problems, path)
    return tuple(rows)


def _row(check: Checker, path: YamlPath, raw: Any) -> OverlayRow | None:
    """One overlay row, or None (with its problems recorded)."""
    entry = check.mapping(path, raw, (), ROW_FIELDS)
    if entry is None:
        return None
    count = len(check.problems)
    fields: dict[str, Any] = {name: entry.get(name) for name in ROW_FIELDS}
    for name in ("repository", "tag", "digest"):
        check.text((*path, name), entry.get(name))
    check.choice((*path, "framework"), entry.get("framework"), tuple(FRAMEWORK_NAMES))
    if not str(entry.get("digest", "")).startswith("sha256:"):
        check.add((*path, "digest"), "expected a sha256: digest")
    fields["platforms"] = check.text_list((*path, "platforms"), entry.get("platforms"))
    if entry.get("forward_compat") is not None:
        drivers = check.text_list((*path, "forward_compat"), entry["forward_compat"])
        fields["forward_compat"] = tuple(
            d
            for i, text in enumerate(drivers)
            if (d := check.driver((*path, "forward_compat", i), text, nullable=False))
        )
    for name in VERSION_FIELDS:
        check.version((*path, name), entry.get(name))
    for name in DRIVER_FIELDS:
        fields[name] = check.driver((*path, name), entry.get(name))
    fields["min_compute_capability"] = check.compute_capability(
        (*path, "min_compute_capability"), entry.get("min_compute_capability")
    )
    if len(check.problems) > count:
        return None
    return OverlayRow(**fields)


def overlay_text(registry: str, synced: str, rows: Sequence[OverlayRow]) -> str:
    """The overlay file for `rows` (YAML; versions quoted, so they stay text)."""
    head = (
        "# Written by `gpuenv matrix sync`: what NGC images say about themselves, merged\n"
        "# over the shipped matrix (never overwriting it). Delete this file to drop it.\n"
    )
    body = {
        "schema": SCHEMA,
        "kind": KIND,
        "synced": synced,
        "registry": registry,
        "images": [row.to_data() for row in sorted(rows, key=lambda r: (r.repository, r.tag))],
    }
    return head + yaml.safe_dump(body, sort_keys=False, allow_unicode=True)


def write(path: str, text: str) -> None:
    """Atomically, in a folder of this user's (0700), the file readable by this user only."""
    make_user_dir(os.path.dirname(path))
    atomic_write(path, text, mode=0o600)


def apply(matrix: Matrix, source: tuple[str, bytes] | None) -> Matrix:
    """The matrix with the overlay at `source` merged over it (itself when none)."""
    if source is None:
        return matrix
    return merge(matrix, parse_rows(source[1], source[0]))


def merge(matrix: Matrix, rows: Sequence[OverlayRow]) -> Matrix:
    """New tags become rows; null shipped fields are filled; nothing is overwritten."""
    if not rows:
        return matrix

    by_image = {(row.repository, row.tag): row for row in matrix.images}
    images = list(matrix.images)
    for found in rows:
        shipped = by_image.get((found.repository, found.tag))
        if shipped is None:
            images.append(_new_row(found, matrix))
        else:
            images[images.index(shipped)] = _filled(shipped, found)
    images.sort(key=ImageRow.sort_key, reverse=True)
    stamp = hashlib.sha256("\n".join(f"{r.image}@{r.digest}" for r in rows).encode())
    return dataclasses.replace(
        matrix, images=tuple(images), version=f"{matrix.version}+image.{stamp.hexdigest()[:8]}"
    )


def _family(matrix: Matrix, repository: str) -> str:
    return next((row.family for row in matrix.images if row.repository == repository), "ngc")


def _new_row(found: OverlayRow, matrix: Matrix) -> ImageRow:
    return ImageRow(
        framework=found.framework,
        family=_family(matrix, found.repository),
        repository=found.repository,
        tag=found.tag,
        release=found.release,
        framework_version=found.framework_version,
        cuda=found.cuda,
        cudnn=found.cudnn,
        python=None,
        ubuntu=found.ubuntu,
        min_driver=found.min_driver,
        forward_compat=found.forward_compat or (),
        min_compute_capability=found.min_compute_capability,
        evidence="image",
        unverified=(),
        note=_image_note(found),
        source=f"image {found.repository}@{found.digest}",
        platforms=_known_platforms(found),
    )


def _known_platforms(found: OverlayRow) -> tuple[str, ...]:
    """The index's platforms that gpuenv resolves for (linux/amd64, linux/arm64)."""
    return tuple(p for p in found.platforms if p in PLATFORMS)


def _image_note(found: OverlayRow) -> str:
    parts = [f"from the image's metadata ({', '.join(found.platforms) or 'platform unknown'})"]
    if found.nccl:
        parts.append(f"NCCL {found.nccl}")
    if found.built_for_driver:
        parts.append(f"built for driver {found.built_for_driver}")
    return "; ".join(parts)


def _filled(shipped: ImageRow, found: OverlayRow) -> ImageRow:
    filled = {
        name: getattr(found, name)
        for name in MERGED_FIELDS
        if getattr(shipped, name) is None and getattr(found, name) is not None
    }
    confirmed = {
        name
        for name in MERGED_FIELDS
        if getattr(shipped, name) is not None
        and getattr(found, name) is not None
        and _agree(getattr(shipped, name), getattr(found, name))
    }
    if not shipped.platforms and _known_platforms(found):
        filled["platforms"] = _known_platforms(found)
    note = shipped.note
    if filled:
        note = f"{note}; filled from the image: {', '.join(filled)}".lstrip("; ")
    return dataclasses.replace(
        shipped,
        **filled,
        unverified=tuple(n for n in shipped.unverified if n not in confirmed),
        note=note,
        source=f"{shipped.source} + image {found.repository}@{found.digest}",
    )


def _agree(shipped: object, from_image: object) -> bool:
    """The same value, or one a less precise spelling of the other (13.0 / 13.0.2,
    2.9.0a0+145a3a7bda / 2.9.0a0+145a3a7, 580 / 580.65.06); compute capabilities equal."""
    if isinstance(shipped, ComputeCapability):
        return shipped == from_image
    short, long = sorted((str(shipped), str(from_image)), key=len)
    return long == short or (long.startswith(short) and ("+" in short or long[len(short)] in ".+"))


def disagreements(matrix: Matrix, rows: Sequence[OverlayRow]) -> list[Disagreement]:
    """The shipped values the images contradict (the merged rows keep the shipped ones)."""
    by_image = {(row.repository, row.tag): row for row in matrix.images}
    out = []
    for found in rows:
        row = by_image.get((found.repository, found.tag))
        if row is None or origin(row) == "image":
            continue
        pairs = [(name, getattr(row, name), getattr(found, name)) for name in MERGED_FIELDS]
        if found.forward_compat is not None:
            shipped_branches = sorted({d.branch for d in row.forward_compat})
            image_branches = sorted({d.branch for d in found.forward_compat})
            if shipped_branches != image_branches:
                pairs.append(
                    ("forward_compat", _branches(shipped_branches), _branches(image_branches))
                )
        for name, shipped, from_image in pairs:
            if shipped is None or from_image is None:
                continue
            if name == "forward_compat" or not _agree(shipped, from_image):
                out.append(
                    Disagreement(
                        found.image, name, str(shipped), str(from_image), row.source, found.digest
                    )
                )
    return out


def _branches(branches: Sequence[int]) -> str:
    return ", ".join(f"R{b}" for b in branches) or "none"


def origin(row: ImageRow) -> str:
    """Where a row came from: ``shipped``, ``image`` or ``shipped + image``."""
    if row.source.startswith("image "):
        return "image"
    return "shipped + image" if " + image " in row.source else "shipped"
