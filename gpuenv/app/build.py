"""The build path that `build`, `run` (when its image is missing), `push` and the exports
share: the project read, the base pulled and pinned, the image rendered and built, the
user's account image made, the build stamp recorded."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, Literal

from gpuenv.app.mirror import configured_mirror
from gpuenv.app.platforms import check_platform
from gpuenv.common.files import file_hash
from gpuenv.engine.protocol import Engine
from gpuenv.images.accounts import Identity, account_image, image_accounts, invoking_identity
from gpuenv.images.bake import BakePolicy, check_bake
from gpuenv.images.progress import ViewFactory
from gpuenv.images.service import (
    BUILDER_KINDS,
    BuildResult,
    build,
    build_inputs,
    build_network,
    ensure_base,
    plan,
)
from gpuenv.lock.locked import Freshness
from gpuenv.lock.project import Project, load_project
from gpuenv.project import stamp

CLASSIC_BUILDER = (
    "this engine builds with Docker's classic builder, not BuildKit: the build keeps no "
    "download cache (every requirement is downloaded and installed again on each rebuild) "
    "and installs with pip, not uv; Docker 18.09 and later build with BuildKit"
)


def _stamp_project(
    project: Project, accounts: tuple[str, str] | None, account: Mapping[str, str] | None
) -> dict[str, Any]:
    """What `gpuenv run` needs of the validated spec and lock, of the image's accounts,
    and the account image made for the user who built it, kept in the build stamp."""
    data: dict[str, Any] = {
        "spec": project.spec.to_data(),
        "spec_path": project.spec.path,
        "locked": project.lock.locked(file_hash(project.lock_path)).to_data(),
    }
    if accounts is not None:
        data["accounts"] = {"passwd": accounts[0], "group": accounts[1]}
    if account is not None:
        data["account"] = dict(account)
    return data


def build_project(
    directory: str,
    engine: Engine,
    view: ViewFactory,
    *,
    bake: bool = False,
    bake_policy: BakePolicy | None = None,
    notice: Callable[[str], None] = lambda _: None,
    identity: Identity | Literal["caller"] | None = "caller",
    freshness: Freshness = "update",
) -> tuple[Project, str, BuildResult | None]:
    """Read the project, render its image and build it if the engine lacks it (pulling
    and pinning the base first); make the account image for `identity` (the user who
    runs it: by default the user who builds, none for root, who runs as root); record
    the build stamp. Returns the project, the tag and
    the BuildResult (None when the image was already there). A baked image is first
    checked for credentials and size (gpuenv.images.bake); `notice` gets the size.
    When the lock's Python packages are older than the requirements (or not resolved
    yet), they are resolved again first and the lock written (`notice` says so, and what
    changed), unless `freshness` is `locked` (LockError) or `frozen`."""
    if identity == "caller":
        identity = None if os.getuid() == 0 else invoking_identity()
    project = load_project(directory, freshness)
    check_platform(project.lock.image, project.lock.resolved.get("platforms") or (), engine)
    if project.stale and freshness == "update":
        from gpuenv.app.overlay import lock_overlay, notice_line

        notice(f"the Python packages are resolved again: {'; '.join(project.stale)}")
        update = lock_overlay(project, engine, view(), on_line=notice_line(notice))
        for line in update.summary():
            notice(line)
        project = update.project
    mirror = configured_mirror()
    builder = engine.builder
    result = None
    planned = plan(project, mirror, bake=bake, builder=builder) if project.lock.digest else None
    if bake:
        files = (planned or plan(project, mirror, bake=True, builder=builder)).files
        notice(check_bake(files, bake_policy or BakePolicy()).describe())
    if planned is None or not engine.has_image(planned.tag):
        if builder == "classic":
            notice(CLASSIC_BUILDER)
        shown = view()
        project, _ = ensure_base(project, engine, shown, mirror)
        planned = plan(project, mirror, bake=bake, builder=builder)
        result = build(planned, engine, shown, network=build_network())
    inputs = build_inputs(project, planned)
    accounts = image_accounts(engine, planned.tag)
    account = None
    if identity is not None and accounts is not None and not bake:
        made = account_image(engine, planned.tag, identity, accounts)
        account = {"tag": made, "for": identity.key} if made else None
    if not (project.stale and freshness == "frozen"):  # --frozen: not the files as they are
        saved = _stamp_project(project, accounts, account)
        stamp.record(directory, bake, planned.tag, inputs, saved)
    return project, planned.tag, result


def pushed_is_stale(project: Project) -> bool:
    """Whether the project changed since the last `gpuenv push` (the pushed image carries
    the code and requirements as they were)."""
    pushed = project.lock.extra.get("pushed") or {}
    reference = str(pushed.get("reference", ""))
    if not reference or project.lock.digest == "":
        return False
    mirror = configured_mirror()
    current = {
        plan(project, mirror, bake=True, builder=b).tag.rsplit(":", 1)[1] for b in BUILDER_KINDS
    }
    return reference.rsplit(":", 1)[-1] not in current
