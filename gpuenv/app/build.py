"""The build paths that `build`, `run` and the exports share: the no-op check from
the build stamp, the build itself (base pulled and pinned first), and the image a run
needs, from the stamp when nothing changed (no YAML parsed, nothing rendered)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuenv.common.files import file_hash
from gpuenv.common.platforms import platform_of_machine, this_platform
from gpuenv.engine.protocol import Engine
from gpuenv.errors import GpuenvError, ResolutionError, UsageError
from gpuenv.images.accounts import Identity, account_image, image_accounts, usable_account_image
from gpuenv.images.bake import BakePolicy, check_bake
from gpuenv.images.registry import InvalidMirror, registry_mirror
from gpuenv.images.service import (
    BUILDER_KINDS,
    BuildResult,
    View,
    build,
    build_inputs,
    build_network,
    ensure_base,
    plan,
)
from gpuenv.lock.locked import Locked
from gpuenv.lock.project import Project, load_project
from gpuenv.project import stamp
from gpuenv.project.spec import Spec, spec_from_data

ViewFactory = Callable[[], "View"]
CLASSIC_BUILDER = (
    "this engine builds with Docker's classic builder, not BuildKit: the build keeps no "
    "download cache (every requirement is downloaded and installed again on each rebuild) "
    "and installs with pip, not uv; Docker 18.09 and later build with BuildKit"
)


def configured_mirror() -> str | None:
    """GPUENV_REGISTRY_MIRROR (or the user config's registry_mirror); a bad value is a
    usage error."""
    try:
        return registry_mirror()[0]
    except InvalidMirror as exc:
        raise UsageError(str(exc)) from None


def engine_platform(engine: Engine) -> str | None:
    """The platform the engine runs containers on: this machine's for a local socket,
    else what the engine says (one request)."""
    if engine.endpoint.startswith("unix://"):
        return this_platform()
    try:
        return platform_of_machine(str(engine.info().get("Architecture") or ""))
    except GpuenvError:
        return None


def check_platform(image: str, platforms: Sequence[str], engine: Engine) -> None:
    """Refuse an image that is not built for the engine's platform (it would fail with
    "exec format error"); nothing when either is unknown."""
    if not platforms:
        return
    here = engine_platform(engine)
    if here is None or here in platforms:
        return

    listed = ", ".join(platforms)
    raise ResolutionError(
        f"{image} is built for {listed}, and this engine runs {here} containers",
        [f"an image for {listed} fails on {here} with 'exec format error'"],
        hint="resolve for this machine with `gpuenv lock --upgrade` (it picks an image built "
        f"for {here}), or run where the image runs",
    )


def up_to_date_tag(directory: str, bake: bool, engine: Engine) -> str | None:
    """The tag of the last build when nothing changed since and the engine still has it."""
    known = stamp.fresh_tag(directory, bake)
    return known if known and engine.has_image(known) else None


def _stamp_project(
    project: Project, accounts: tuple[str, str] | None, account: Mapping[str, str] | None
) -> dict[str, Any]:
    """What `gpuenv run` needs of the validated spec and lock, of the image's accounts,
    and the account image made for the user who built it, kept in the build stamp."""
    data: dict[str, Any] = {
        "spec": project.spec.to_data(),
        "spec_path": project.spec.path,
        "locked": Locked.from_lock(project.lock, file_hash(project.lock_path)).to_data(),
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
    identity: Identity | None = None,
) -> tuple[Project, str, BuildResult | None]:
    """Read the project, render its image and build it if the engine lacks it (pulling
    and pinning the base first); make the account image for `identity` (the user who
    runs it, None for root); record the build stamp. Returns the project, the tag and
    the BuildResult (None when the image was already there). A baked image is first
    checked for credentials and size (gpuenv.images.bake); `notice` gets the size."""
    project = load_project(directory)
    check_platform(project.lock.image, project.lock.resolved.get("platforms") or (), engine)
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
    stamp.record(directory, bake, planned.tag, inputs, _stamp_project(project, accounts, account))
    return project, planned.tag, result


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
    directory: str, engine: Engine, view: ViewFactory, identity: Identity | None = None
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

    project, tag, _ = build_project(directory, engine, view, identity=identity)
    locked = Locked.from_lock(project.lock, file_hash(project.lock_path))
    saved = (stamp.fresh(directory, False) or {}).get("project") or {}
    account = usable_account_image(engine, saved.get("account"), tag, identity)
    return RunImage(project.spec, locked, tag, _accounts(saved), account)


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
