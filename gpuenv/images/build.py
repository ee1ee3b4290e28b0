"""The build paths that `build`, `run` and the exports share: the no-op check from
the build stamp, the build itself (base pulled and pinned first), and the image a run
needs, from the stamp when nothing changed (no YAML parsed, nothing rendered)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpuenv.errors import UsageError

if TYPE_CHECKING:
    from gpuenv.engine.protocol import Engine
    from gpuenv.images.service import BuildResult, Project, View
    from gpuenv.project.spec import Spec
    from gpuenv.resolution.locked import Locked

ViewFactory = Callable[[], "View"]


def configured_mirror() -> str | None:
    """GPUENV_REGISTRY_MIRROR (or the user config's registry_mirror); a bad value is a
    usage error."""
    from gpuenv.images.registry import InvalidMirror, registry_mirror

    try:
        return registry_mirror()[0]
    except InvalidMirror as exc:
        raise UsageError(str(exc)) from None


def up_to_date_tag(directory: str, bake: bool, engine: Engine) -> str | None:
    """The tag of the last build when nothing changed since and the engine still has it."""
    from gpuenv.project import stamp

    known = stamp.fresh_tag(directory, bake)
    return known if known and engine.has_image(known) else None


def _stamp_project(project: Project) -> dict[str, Any]:
    """What `gpuenv run` needs of the validated spec and lock, kept in the build stamp."""
    from gpuenv.common.files import file_hash
    from gpuenv.resolution.locked import Locked

    return {
        "spec": project.spec.to_data(),
        "spec_path": project.spec.path,
        "locked": Locked.from_lock(project.lock, file_hash(project.lock_path)).to_data(),
    }


def build_project(
    directory: str, engine: Engine, view: ViewFactory, *, bake: bool = False
) -> tuple[Project, str, BuildResult | None]:
    """Read the project, render its image and build it if the engine lacks it (pulling
    and pinning the base first); record the build stamp. Returns the project, the tag
    and the BuildResult (None when the image was already there)."""
    from gpuenv.images.service import build, build_inputs, ensure_base, load_project, plan
    from gpuenv.project import stamp

    project = load_project(directory)
    mirror = configured_mirror()
    result = None
    planned = plan(project, mirror, bake=bake) if project.lock.digest else None
    if planned is None or not engine.has_image(planned.tag):
        shown = view()
        project, _ = ensure_base(project, engine, shown, mirror)
        planned = plan(project, mirror, bake=bake)
        result = build(planned, engine, shown)
    stamp.record(
        directory, bake, planned.tag, build_inputs(project, planned), _stamp_project(project)
    )
    return project, planned.tag, result


def image_for_run(directory: str, engine: Engine, view: ViewFactory) -> tuple[Spec, Locked, str]:
    """The spec, the lock (as a run needs it) and the image tag, building first if missing.

    When nothing changed since the last build, all three come from the build stamp.
    """
    from gpuenv.project import stamp
    from gpuenv.project.spec import spec_from_data
    from gpuenv.resolution.locked import Locked

    known = stamp.fresh(directory, False)
    if known and known.get("project") and engine.has_image(known["tag"]):
        saved = known["project"]
        spec = spec_from_data(saved["spec"], directory, saved["spec_path"])
        return spec, Locked(**saved["locked"]), str(known["tag"])

    from gpuenv.common.files import file_hash

    project, tag, _ = build_project(directory, engine, view)
    return project.spec, Locked.from_lock(project.lock, file_hash(project.lock_path)), tag


def pushed_is_stale(project: Project) -> bool:
    """Whether the project changed since the last `gpuenv push` (the pushed image carries
    the code and requirements as they were)."""
    from gpuenv.images.service import plan

    pushed = project.lock.extra.get("pushed") or {}
    reference = str(pushed.get("reference", ""))
    if not reference or project.lock.digest == "":
        return False
    current = plan(project, configured_mirror(), bake=True).tag.rsplit(":", 1)[1]
    return reference.rsplit(":", 1)[-1] != current
