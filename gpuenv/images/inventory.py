"""The images gpuenv built, and which of them may go: each with whether a lock still
refers to it (`gpuenv images`), the unreferenced ones removed (`gpuenv gc`), and the
builds' dependency caches (`gpuenv gc --caches`)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpuenv.common.labels import LABEL_PREFIX
from gpuenv.engine.protocol import BuildCache, Engine, ImageInfo
from gpuenv.errors import GpuenvError
from gpuenv.images.accounts import ACCOUNT_BASE_LABEL, ACCOUNT_LABEL
from gpuenv.images.render import SUPPORT_DIR
from gpuenv.images.service import BUILDER_KINDS, PROJECT_LABEL, plan
from gpuenv.lock.lockfile import LOCK_FILENAME
from gpuenv.lock.project import load_project


@dataclass(frozen=True)
class ImageRow:
    info: ImageInfo
    project: str
    project_dir: str
    referenced: bool
    reason: str  # "current", "stale lock", "folder gone", ...

    def to_data(self) -> dict[str, Any]:
        return {
            "tags": list(self.info.tags),
            "id": self.info.id,
            "project": self.project,
            "project_dir": self.project_dir,
            "size": self.info.size,
            "created": self.info.created,
            "referenced": self.referenced,
            "status": self.reason,
        }


def referenced_tags(directory: str, mirror: str | None) -> set[str]:
    """The image tags a project folder's spec and lock refer to (plain and baked)."""
    try:
        project = load_project(directory, "frozen")
    except GpuenvError:
        return set()
    tags = set()
    for builder in BUILDER_KINDS:  # whichever builder made it, the lock refers to it
        with contextlib.suppress(GpuenvError, OSError):
            tags.add(plan(project, mirror, builder=builder).tag)
            tags.add(plan(project, mirror, bake=True, builder=builder).tag)
    return tags


def project_folders(folders: Sequence[str]) -> list[str]:
    """The projects in FOLDERS: each folder with a gpuenv.yaml, and such folders just below."""
    found = []
    for folder in folders:
        root = os.path.abspath(folder)
        if os.path.isfile(os.path.join(root, "gpuenv.yaml")):
            found.append(root)
        with contextlib.suppress(OSError):
            for entry in sorted(os.scandir(root), key=lambda e: e.name):
                if entry.is_dir() and os.path.isfile(os.path.join(entry.path, "gpuenv.yaml")):
                    found.append(entry.path)
    return found


def _inside(path: str, folders: Sequence[str]) -> bool:
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


def list_images(engine: Engine, mirror: str | None, folders: Sequence[str] = ()) -> list[ImageRow]:
    """gpuenv-built images, each with whether a lock still refers to it.

    An image is in use while the lock of any project gpuenv knows of refers to it: the
    folder each image was built from, and the projects in `folders`. With `folders`, only
    images built from projects inside them are listed (gc never reaches further).
    """
    roots = [os.path.abspath(f) for f in folders]
    infos = [
        info
        for info in engine.images(PROJECT_LABEL)
        # Images built FROM a gpuenv image inherit its labels, not its gpuenv/ tag; a
        # user's account image goes with the image it was made from (`collect`).
        if any(t.startswith(f"gpuenv/{info.labels.get(PROJECT_LABEL)}:") for t in info.tags)
        and ACCOUNT_LABEL not in info.labels
    ]
    known = set(project_folders(folders))
    known |= {info.labels.get(f"{LABEL_PREFIX}.project-dir", "") for info in infos} - {""}
    in_use: set[str] = set()
    for directory in sorted(known):
        in_use |= referenced_tags(directory, mirror)
    rows = []
    for info in sorted(infos, key=lambda i: -i.created):
        project = info.labels.get(PROJECT_LABEL, "?")
        own = info.labels.get(f"{LABEL_PREFIX}.project-dir", "")
        if roots and not _inside(own, roots):
            continue
        referenced = any(tag in in_use for tag in info.tags)
        if referenced:
            reason = "in use by a lock"
        elif own and not os.path.isdir(own):
            reason = "project folder gone"
        elif own and not os.path.exists(os.path.join(own, LOCK_FILENAME)):
            reason = "no gpuenv.lock in its folder"
        else:
            reason = "no lock refers to it"
        rows.append(ImageRow(info, project, own, referenced, reason))
    return rows


@dataclass(frozen=True)
class GcOutcome:
    doomed: tuple[ImageRow, ...] = ()  # unreferenced and unused: removed with --yes
    removed: tuple[ImageRow, ...] = ()
    held: tuple[tuple[ImageRow, tuple[str, ...]], ...] = ()  # unreferenced, but a container uses it


def collect(engine: Engine, rows: Sequence[ImageRow], remove: bool) -> GcOutcome:
    """The unreferenced images, removed when `remove` is true. An image that a container
    still uses (a stopped one too) is kept and reported with the containers' names."""
    doomed: list[ImageRow] = []
    held: list[tuple[ImageRow, tuple[str, ...]]] = []
    for row in rows:
        if row.referenced:
            continue
        users = tuple(engine.image_users(row.info.id))
        if users:
            held.append((row, users))
        else:
            doomed.append(row)
    removed: list[ImageRow] = []
    if remove:
        accounts = engine.images(ACCOUNT_BASE_LABEL) if doomed else []
        for row in doomed:
            for account in accounts:  # the users' account images made from it go first
                if account.labels.get(ACCOUNT_BASE_LABEL) in row.info.tags:
                    for tag in account.tags or (account.id,):
                        engine.remove_image(tag)
            engine.remove_image(row.info.id if not row.info.tags else row.info.tags[0])
            for tag in row.info.tags[1:]:
                engine.remove_image(tag)
            removed.append(row)
    return GcOutcome(tuple(doomed), tuple(removed), tuple(held))


def dependency_caches(engine: Engine) -> list[BuildCache] | None:
    """The cache mounts of gpuenv's install steps (downloaded wheels, uv's and apt's
    caches) in the engine's builder, every user's: a BuildKit record does not say whose
    build made it. None when the engine cannot list them (Podman)."""
    caches = engine.build_caches()
    if caches is None:
        return None
    return [cache for cache in caches if f"{SUPPORT_DIR}/" in cache.description]
