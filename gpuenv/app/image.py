"""The image a run uses, and whether a build has anything to do: from the build stamp
when nothing changed since the last build (no YAML parsed, nothing rendered), so a run
or a no-op build loads none of the build path (`app.build`), which comes in only when
an image must be built."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuenv.app.platforms import check_platform
from gpuenv.common.files import file_hash
from gpuenv.engine.protocol import Engine
from gpuenv.images.accounts import Identity, usable_account_image
from gpuenv.images.progress import ViewFactory
from gpuenv.lock.locked import Freshness, Locked
from gpuenv.project import stamp
from gpuenv.project.spec import Spec, spec_from_data


def up_to_date_tag(directory: str, bake: bool, engine: Engine) -> str | None:
    """The tag of the last build when nothing changed since and the engine still has it."""
    known = stamp.fresh_tag(directory, bake)
    return known if known and engine.has_image(known) else None


@dataclass(frozen=True)
class RunImage:
    """What a run needs: the spec, the lock (as a run needs it), the image tag, the
    image's /etc/passwd and /etc/group (None when unknown), and the account image of
    the invoking user (None when there is none to trust: the run uploads the entries)."""

    spec: Spec
    locked: Locked
    tag: str
    accounts: tuple[str, str] | None = None
    account_tag: str | None = None


def _accounts(saved: Mapping[str, Any]) -> tuple[str, str] | None:
    accounts = saved.get("accounts")
    if isinstance(accounts, dict) and isinstance(accounts.get("passwd"), str):
        return str(accounts["passwd"]), str(accounts.get("group") or "")
    return None


def image_for_run(
    directory: str,
    engine: Engine,
    view: ViewFactory,
    identity: Identity | None = None,
    *,
    notice: Callable[[str], None] = lambda _: None,
    freshness: Freshness = "update",
) -> RunImage:
    """The image a run uses, building first if missing.

    When nothing changed since the last build, everything comes from the build stamp:
    no YAML is parsed, nothing is rendered, the image's accounts are not read again, and
    one request finds the image (the account image of `identity` where it is recorded
    and checks out, else the image).
    """
    known = stamp.fresh(directory, False)
    if known and known.get("project"):
        saved, tag = known["project"], str(known["tag"])
        account = usable_account_image(engine, saved.get("account"), tag, identity)
        if account or engine.has_image(tag):
            spec = spec_from_data(saved["spec"], directory, saved["spec_path"])
            locked = Locked(**saved["locked"])
            check_platform(locked.image, locked.resolved.get("platforms") or (), engine)
            return RunImage(spec, locked, tag, _accounts(saved), account)

    # The build path (the lock, the matrix, render, pull: ~0.1 s of imports), only now.
    from gpuenv.app.build import build_project

    project, tag, _ = build_project(
        directory, engine, view, identity=identity, notice=notice, freshness=freshness
    )
    locked = project.lock.locked(file_hash(project.lock_path))
    saved = (stamp.fresh(directory, False) or {}).get("project") or {}
    account = usable_account_image(engine, saved.get("account"), tag, identity)
    return RunImage(project.spec, locked, tag, _accounts(saved), account)
