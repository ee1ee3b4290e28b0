"""gpuenv.lock: the resolved environment, pinned, committed, checked.

The lock records what was chosen and from what: the spec's hash, every requirements
file's hash, the matrix version, the image (and its digest once pulled), every resolved
version, and what the image needs from a host. It is written atomically (temporary file,
fsync, rename), so a crash or Ctrl-C never leaves half a lock.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from gpuenv import __version__
from gpuenv.common import nesting
from gpuenv.common.files import atomic_write, file_hash
from gpuenv.common.versions import as_written, recorded_capability, recorded_driver
from gpuenv.errors import LockError, file_error
from gpuenv.host.machine import Gpu, Host
from gpuenv.lock.locked import LOCK_FILENAME as LOCK_FILENAME
from gpuenv.lock.locked import Locked
from gpuenv.lock.overlay import NOTHING, UNRESOLVED, Overlay, overlay_from_data
from gpuenv.matrix.load import Matrix
from gpuenv.matrix.model import ImageRow
from gpuenv.project.dependencies import read_dependencies
from gpuenv.project.sources import Collected
from gpuenv.project.spec import Spec, is_image_base
from gpuenv.resolution.resolve import classify_gpus, evaluate, selected_gpus
from gpuenv.resolution.verdicts import Resolution

LOCK_VERSION = 2  # 2: the overlay; no project name (a clone's folder never matters)
HEADER = """\
# gpuenv.lock: written by gpuenv; do not edit by hand.
# Commit this file: it pins the exact image and versions that every teammate, CI job
# and cluster node will use. `gpuenv lock` updates it after gpuenv.yaml changes,
# `gpuenv lock --upgrade` moves to the newest image that fits, and
# `gpuenv lock --check` (for CI) fails when gpuenv.yaml or a requirements file no longer
# matches it. `overlay` pins every Python package a build installs on the image.
"""


@dataclass(frozen=True)
class Lock:
    """The parsed lock; `data` keeps every section for commands that need more."""

    spec_hash: str
    requirements: dict[str, str]
    matrix_version: str
    image: str
    digest: str
    resolved: dict[str, Any]
    requires: dict[str, Any]
    resolved_for: dict[str, Any]
    overlay: Overlay = UNRESOLVED
    gpuenv_version: str = __version__
    lock_version: int = LOCK_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def locked(self, lock_hash: str) -> Locked:
        """What a run needs of this lock (`lock_hash`: the file's hash)."""
        return Locked(self.image, lock_hash, dict(self.resolved), dict(self.requires))

    @property
    def pinned_image(self) -> str:
        """The reference to use: by digest once known, else by tag."""
        if self.digest:
            return f"{self.image.rsplit(':', 1)[0]}@{self.digest}"
        return self.image

    def to_data(self) -> dict[str, Any]:
        return {
            "lock_version": self.lock_version,
            "gpuenv_version": self.gpuenv_version,
            "spec_hash": self.spec_hash,
            "requirements": dict(sorted(self.requirements.items())),
            "matrix_version": self.matrix_version,
            "image": {"reference": self.image, "digest": self.digest},
            "resolved": self.resolved,
            "requires": self.requires,
            "resolved_for": self.resolved_for,
            "overlay": self.overlay.to_data(),
            **self.extra,
        }


def requirements_hashes(spec: Spec, collected: Collected | None = None) -> dict[str, str]:
    """Hashes of every file the spec's dependencies are read from: the requirements files
    and what they include (-r / -c), pyproject.toml and the uv.lock beside it,
    environment.yml. A file that cannot be followed is a located SpecError (exit 3).
    `collected`: the dependencies as already read (they are read otherwise)."""
    if collected is None:
        collected = read_dependencies(spec)
    return {
        relative: file_hash(os.path.join(spec.project_dir, relative))
        for relative in collected.files
    }


def lock_from_resolution(resolution: Resolution, matrix_version: str, digest: str = "") -> Lock:
    spec, row, host = resolution.spec, resolution.row, resolution.host
    return Lock(
        spec_hash=spec.digest(),
        requirements=requirements_hashes(spec),
        matrix_version=matrix_version,
        image=row.image,
        digest=digest,
        overlay=UNRESOLVED if spec.requirements or spec.packages else NOTHING,
        resolved={
            "framework": row.framework,
            "framework_version": row.framework_version,
            "release": row.release,
            "cuda": row.cuda,
            "cudnn": row.cudnn,
            "python": row.python,
            "ubuntu": row.ubuntu,
            "evidence": row.evidence,
            "unverified": list(row.unverified),
            "platforms": list(row.platforms),
            # An image of the team's own: what was read from it, and from where
            **({"read_from": row.note} if is_image_base(row.family) else {}),
        },
        requires={
            "min_driver": as_written(resolution.candidate.min_driver),
            "forward_compat": [str(driver) for driver in row.forward_compat],
            "min_compute_capability": as_written(row.min_compute_capability),
            "compute_capabilities": list(resolution.required_compute_capabilities),
        },
        resolved_for={
            "source": host.source,
            "driver": as_written(host.driver),
            # native | minor-version compatibility | forward compatibility | None
            "compatibility": resolution.candidate.mode,
            # False: a forward route NVIDIA's documents disagree on (see resolve's route)
            "route_verified": resolution.candidate.route_verified,
            "platform": host.platform,
            "gpus": [
                {"name": g.name, "compute_capability": as_written(g.compute_capability)}
                for g in resolution.gpus
            ],
        },
    )


INTEGRITY_KEY = "integrity"


def integrity(data: dict[str, Any]) -> str:
    """A digest of everything the lock says (but itself): gpuenv writes it with the lock,
    so a lock edited by hand no longer matches."""
    body = {k: v for k, v in data.items() if k != INTEGRITY_KEY}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def render_lock(lock: Lock) -> str:
    data = {k: v for k, v in lock.to_data().items() if k != INTEGRITY_KEY}
    data[INTEGRITY_KEY] = integrity(data)
    body = yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=100)
    return HEADER + body


def write_lock(path: str, lock: Lock) -> None:
    """Write atomically: a reader sees the old lock or the new one, never a mix."""
    atomic_write(path, render_lock(lock))


def _need(data: dict[str, Any], key: str, kind: type, where: str) -> Any:
    value = data.get(key)
    if not isinstance(value, kind):
        raise LockError(
            f"{where} is damaged: '{key}' is missing or not a {kind.__name__}",
            hint="run `gpuenv lock` to write it again from gpuenv.yaml",
        )
    return value


# The sections gpuenv reads; any other is kept in `Lock.extra` as it is.
_LOCK_SECTIONS = frozenset(
    {
        "lock_version",
        "gpuenv_version",
        "project",
        "spec_hash",
        "requirements",
        "matrix_version",
        "image",
        "resolved",
        "requires",
        "resolved_for",
        "overlay",
        INTEGRITY_KEY,
    }
)


def read_lock(path: str) -> Lock:
    """Read and validate the lock; every failure is a LockError that says what to run."""
    where = os.path.basename(path)
    data = _lock_data(path, where)
    _check_integrity(data, where)
    version = _lock_version(data, where)
    reference, digest = _locked_image(data, where)
    return Lock(
        spec_hash=_need(data, "spec_hash", str, where),
        requirements=dict(_need(data, "requirements", dict, where)),
        matrix_version=_need(data, "matrix_version", str, where),
        image=reference,
        digest=digest,
        resolved=_need(data, "resolved", dict, where),
        requires=_need(data, "requires", dict, where),
        resolved_for=_need(data, "resolved_for", dict, where),
        overlay=overlay_from_data(data.get("overlay"), where),
        gpuenv_version=str(data.get("gpuenv_version", "")),
        lock_version=version,
        extra={k: v for k, v in data.items() if k not in _LOCK_SECTIONS},
    )


def _lock_data(path: str, where: str) -> dict[str, Any]:
    """The lock's YAML mapping; LockError when it is missing or is not one."""
    if not os.path.isfile(path):
        raise LockError(f"{where} not found", hint="run `gpuenv lock` to resolve and write it")
    try:
        with open(path, encoding="utf-8") as handle:
            data = nesting.loads(yaml.safe_load, handle.read())
    except OSError as exc:
        raise file_error(exc, "read", path) from None
    except UnicodeDecodeError as exc:
        raise LockError(
            f"{where} is damaged (not UTF-8 text: {exc.reason})",
            hint="run `gpuenv lock` to write it again from gpuenv.yaml",
        ) from None
    except (yaml.YAMLError, nesting.TooDeep) as exc:
        raise LockError(
            f"{where} is damaged (not valid YAML: {str(exc).splitlines()[0]})",
            hint="run `gpuenv lock` to write it again from gpuenv.yaml",
        ) from None
    if not isinstance(data, dict):
        raise LockError(f"{where} is damaged", hint="run `gpuenv lock` to write it again")
    return data


def _check_integrity(data: dict[str, Any], where: str) -> None:
    """LockError when the lock no longer matches the digest gpuenv wrote into it."""
    recorded = data.get(INTEGRITY_KEY)
    if recorded is not None and recorded != integrity(data):
        raise LockError(
            f"{where} was edited by hand: its content no longer matches its integrity digest",
            hint="never edit the lock: change gpuenv.yaml and run `gpuenv lock` "
            "(`gpuenv lock --upgrade` to move to the newest image that fits)",
        )


def _lock_version(data: dict[str, Any], where: str) -> int:
    """The lock's format; LockError for one a newer gpuenv wrote."""
    version: int = _need(data, "lock_version", int, where)
    if version > LOCK_VERSION:
        raise LockError(
            f"{where} was written by a newer gpuenv ({data.get('gpuenv_version')}, lock "
            f"format {version}); this gpuenv reads format {LOCK_VERSION}",
            hint="upgrade gpuenv (pip install -U gpuenv)",
        )
    return version


def _locked_image(data: dict[str, Any], where: str) -> tuple[str, str]:
    """The locked image's reference and digest ("" until it was pulled)."""
    image = _need(data, "image", dict, where)
    reference: str = _need(image, "reference", str, where)
    digest = image.get("digest") or ""
    if not isinstance(digest, str) or (digest and not re.match(r"^sha256:[0-9a-f]{64}$", digest)):
        raise LockError(f"{where} is damaged: image digest {digest!r} is not sha256:<64 hex>")
    return reference, digest


def lock_differences(lock: Lock, spec: Spec, current: Mapping[str, str] | None = None) -> list[str]:
    """What changed between the lock and the spec (empty: the lock is up to date).
    `current`: the dependency files' requirements_hashes, when already computed."""
    out = []
    spec_name = os.path.basename(spec.path) if spec.path else "gpuenv.yaml"
    if lock.spec_hash != spec.digest():
        out.append(f"{spec_name} changed since the lock was written")
    if current is None:
        current = requirements_hashes(spec)
    for name in sorted(set(current) | set(lock.requirements)):
        if name not in lock.requirements:
            out.append(f"requirements file {name} is new")
        elif name not in current:
            out.append(f"requirements file {name} is no longer used")
        elif current[name] != lock.requirements[name]:
            out.append(f"requirements file {name} changed")
    return out


SPEC_SOURCE = "gpuenv.yaml (requirements, packages, extras)"


def overlay_sources(spec: Spec, hashes: Mapping[str, str]) -> dict[str, str]:
    """What the Python packages are resolved from: the dependency files' hashes, and a
    hash of the spec's fields that name requirements (an edit of `packages:` or
    `extras:` makes them stale too)."""
    fields = {"requirements": spec.requirements, "packages": spec.packages, "extras": spec.extras}
    blob = json.dumps(fields, sort_keys=True, default=list).encode()
    return {**hashes, SPEC_SOURCE: "sha256:" + hashlib.sha256(blob).hexdigest()}


def overlay_differences(lock: Lock, spec: Spec, current: Mapping[str, str]) -> list[str]:
    """Why the lock's overlay (the Python packages on the image) is not the one the
    spec and its dependency files ask for now; empty when it is (always, for a spec
    that installs no Python package)."""
    overlay = lock.overlay
    if not (spec.requirements or spec.packages):
        return []
    if not overlay.resolved:
        return [f"the Python packages on the image are not locked: {overlay.note}"]
    sources = overlay_sources(spec, current)
    out = []
    for name in sorted(set(sources) | set(overlay.sources)):
        if sources.get(name) != overlay.sources.get(name):
            out.append(f"{name} changed since the Python packages were locked")
    return out


def recorded_host(lock: Lock) -> Host | None:
    """The host a lock was resolved for, to plan for it again from a machine without GPUs."""
    record = lock.resolved_for
    driver = recorded_driver(record.get("driver"))
    if driver is None:
        return None
    gpus = []
    for index, item in enumerate(record.get("gpus") or []):
        if isinstance(item, dict) and isinstance(item.get("name"), str):
            cc = recorded_capability(item.get("compute_capability"))
            gpus.append(Gpu(index, item["name"], compute_capability=cc))
    platform = record.get("platform")
    return Host(
        driver, tuple(gpus), "lock", platform=platform if isinstance(platform, str) else None
    )


def own_row_from_lock(lock: Lock, base: str) -> ImageRow | None:
    """The row of an own base (`base:` naming an image) as the lock recorded it when it
    read the image; None when the lock pins another image."""
    if lock.image != base.partition("@")[0] or "read_from" not in lock.resolved:
        return None
    resolved, requires = lock.resolved, lock.requires

    def text(data: dict[str, Any], key: str) -> str | None:
        value = data.get(key)
        return value if isinstance(value, str) and value else None

    repository, _, tag = lock.image.rpartition(":")
    branches = requires.get("forward_compat") or []
    platforms = resolved.get("platforms") or []
    return ImageRow(
        framework=text(resolved, "framework") or "none",
        family=base,
        repository=repository,
        tag=tag,
        release=None,
        framework_version=text(resolved, "framework_version"),
        cuda=text(resolved, "cuda"),
        cudnn=text(resolved, "cudnn"),
        python=text(resolved, "python"),
        ubuntu=text(resolved, "ubuntu"),
        min_driver=recorded_driver(requires.get("min_driver")),
        forward_compat=tuple(d for b in branches if (d := recorded_driver(b)) is not None),
        min_compute_capability=recorded_capability(requires.get("min_compute_capability")),
        evidence="image",
        unverified=(),
        note=text(resolved, "read_from") or "",
        source=base,
        platforms=tuple(str(p) for p in platforms if isinstance(p, str)),
    )


def locked_row_problems(lock: Lock, spec: Spec, matrix: Matrix) -> list[str]:
    """Why the locked image is not one gpuenv would pin for this spec: it is in no
    matrix (shipped or synced), or it fails the spec or the host the lock was resolved
    for. Empty when the lock is honest. An own base's row is the one the lock recorded
    when it read the image."""
    if is_image_base(spec.base):
        row = own_row_from_lock(lock, spec.base)
        if row is None:
            return [f"{lock.image} is not the image gpuenv.yaml's base names ({spec.base})"]
    else:
        row = next((r for r in matrix.images if r.image == lock.image), None)
    if row is None:
        return [f"{lock.image} is in no matrix (shipped, or synced with `gpuenv matrix sync`)"]
    host = recorded_host(lock) or Host(None, (), "none")
    gpus = selected_gpus(spec, classify_gpus(host, matrix))
    (candidate,) = evaluate(spec, matrix, host, gpus, [row])
    return [f"{row.label} {rejection.reason}" for rejection in candidate.rejections]


def check_locked_row(lock: Lock, spec: Spec, matrix: Matrix) -> None:
    """LockError (exit 5) when `locked_row_problems` finds any. A lock whose digest
    holds was written by gpuenv: its image stopped fitting because the matrix changed
    (a corrected row, or an overlay that no longer has it), and the message says so."""
    problems = locked_row_problems(lock, spec, matrix)
    if problems:
        since = (
            f" (the lock was resolved against matrix {lock.matrix_version}; "
            f"this is matrix {matrix.version})"
            if lock.matrix_version and lock.matrix_version != matrix.version
            else ""
        )
        raise LockError(
            f"{LOCK_FILENAME} pins an image that does not fit: " + "; ".join(problems) + since,
            hint="run `gpuenv lock --upgrade` to resolve again and pin an image that fits "
            "(gpuenv never re-resolves on its own), then commit gpuenv.lock",
        )
