"""`gpuenv export devcontainer` and `gpuenv devcontainer-claim`: an editor (VS Code's Dev
Containers, `@devcontainers/cli`) in the locked environment, without bypassing the GPU
reservations of a shared server.

Export writes `.devcontainer/devcontainer.json` (`run.devcontainer`) for the invoking
user on this host: the image gpuenv built from the lock (the user's account child, so
the editor's server has a HOME), the project at /workspace, the exact GPUs chosen now
among the free ones, and the limits a run gets.

Why a lifecycle command and not a claim the reaper ties to the container: a claim must
exist before the container gets its GPUs, or a `gpuenv run` could land on them in
between, and only the editor's tools know when they create or start it. So the file's
`initializeCommand` runs `gpuenv devcontainer-claim` on the host first, every time the
editor opens it: it claims exactly the file's GPUs like a run's (refusing, with who
holds them, when they are taken; nothing starts then), and hands the claims to a keeper
that holds them while the container called as the file says runs (`app.keeper`). So
`ps`, `top`, the queue and the dashboard see it, and a run never lands on its GPUs.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpuenv.app.image import RunImage, image_for_run
from gpuenv.app.launch import Services, gpu_requests, spawn_keeper
from gpuenv.common.files import atomic_write
from gpuenv.containers.config import STACK_BYTES, memlock_limit, shm_size
from gpuenv.containers.devcontainer import (
    DEVCONTAINER_PATH,
    WORKSPACE_FOLDER,
    EditorContainer,
    NotOurs,
    Written,
    container_name,
    devcontainer_config,
    gpu_run_args,
    read_devcontainer,
    read_written,
    render,
    stale_against_lock,
)
from gpuenv.engine.protocol import Engine
from gpuenv.errors import EngineRefused, FileAccessError, GpusBusy, LockError, UsageError
from gpuenv.host.machine import Host
from gpuenv.images.accounts import Identity, account_image
from gpuenv.images.progress import ViewFactory
from gpuenv.monitoring.fitness import unfit_gpus
from gpuenv.project.mounts import run_binds
from gpuenv.project.spec import GpuRequest
from gpuenv.project.variables import image_environment, refers, spec_with_image_env
from gpuenv.reservations.claims import Claim, ClaimStore
from gpuenv.reservations.gpus import Grant, choose, grant, parse_gpus_option
from gpuenv.reservations.reserve import reserve

EXPORT_AGAIN = "run `gpuenv export devcontainer` again, then reopen (or rebuild) the container"


@dataclass(frozen=True)
class Exported:
    path: str
    editor: EditorContainer


def export_devcontainer(
    directory: str,
    engine: Engine,
    *,
    services: Services,
    environ: Mapping[str, str],
    view: ViewFactory,
    notice: Callable[[str], None],
    uid: int,
    gpus: str | None = None,
    force: bool = False,
) -> Exported:
    """Write .devcontainer/devcontainer.json for this user on this host (see the module
    docstring); the image built first if missing. `gpus`: --gpus, over the spec's."""
    path = os.path.join(directory, DEVCONTAINER_PATH)
    if not force:
        _refuse_a_file_of_yours(path)
    identity = None if uid == 0 else services.identity()
    image = editor_image(directory, engine, view, identity, notice)
    spec = image.run.spec
    if refers(spec.env):  # `PATH: /opt/bin:$PATH`: the image's PATH, as a run's
        spec = spec_with_image_env(spec, image_environment(engine.image_config(image.tag)))
    if any(ch in spec.project_dir for ch in ',"'):
        raise UsageError(
            f"the project folder {spec.project_dir} has a comma or a quote in its path, "
            "which the devcontainer.json workspace mount cannot carry",
            hint="rename the folder (or clone the project into one without them)",
        )
    binds = tuple(run_binds(spec, (), (), env=environ, notice=notice))
    for bind in binds:
        if any(ch in bind.source + bind.target for ch in ',"'):
            raise UsageError(
                f"the mount {bind.source}:{bind.target} has a comma or a quote in its path, "
                "which a devcontainer.json mount cannot carry",
                hint="rename the folder, or leave the mount out of gpuenv.yaml",
            )
    request = parse_gpus_option(gpus) if gpus else spec.gpus
    host = services.detect_host() if request.mode != "none" else Host(None, (), "none")
    name = container_name(spec.name, spec.project_dir, uid)
    # the editor's own claims (its container runs now) are free to it: exported again,
    # it keeps its GPUs where it can
    granted, keys = _choose(
        request, host, services.claim_store, lambda c: c.uid == uid and c.run == name
    )
    requests = gpu_requests(engine, host, granted, environ, notice)
    editor = EditorContainer(
        spec=spec,
        image=image.tag,
        lock_hash=image.run.locked.lock_hash,
        name=name,
        host=socket.gethostname(),
        identity=identity,
        gpus=tuple(keys),
        gpu_args=gpu_run_args(requests),
        visible_devices=granted.visible_devices,
        grant=granted.describe(),
        binds=binds,
        ports=spec.ports,
        shm_size=shm_size(spec),
        memlock=memlock_limit(),
        stack=STACK_BYTES,
        claim_command=(sys.executable, "-m", "gpuenv.cli", "-C", WORKSPACE_FOLDER, CLAIM_COMMAND),
    )
    who = identity.name if identity else "root"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write(path, render(devcontainer_config(editor), who))
    return Exported(path, editor)


CLAIM_COMMAND = "devcontainer-claim"


def _refuse_a_file_of_yours(path: str) -> None:
    """A devcontainer.json gpuenv did not write is the user's: never overwritten."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        return
    except (OSError, UnicodeDecodeError) as exc:
        raise FileAccessError(f"{path}: cannot read it ({exc})") from None
    try:
        read_written(text)
    except NotOurs:
        raise UsageError(
            f"{path} exists and gpuenv did not write it: it is left as it is",
            hint="move it away (or keep yours and copy from gpuenv's), or --force replaces it",
        ) from None


@dataclass(frozen=True)
class EditorImage:
    run: RunImage
    tag: str  # what the editor's container runs: the user's account child where made


def editor_image(
    directory: str,
    engine: Engine,
    view: ViewFactory,
    identity: Identity | None,
    notice: Callable[[str], None],
) -> EditorImage:
    """The locked image (built if missing) and, for a user, its child with their account
    in it, made if missing: the editor's server needs the user's HOME, and the Dev
    Containers tools cannot upload it as a run does."""
    image = image_for_run(directory, engine, view, identity, notice=notice)
    if identity is None:
        return EditorImage(image, image.tag)
    tag = image.account_tag
    if tag is None and image.accounts is not None:
        tag = account_image(engine, image.tag, identity, image.accounts)
    if tag is None:
        notice(
            f"the image has no account for {identity.name} and none could be added: the "
            f"editor runs as uid {identity.uid} with HOME {identity.home}, which may not exist"
        )
        return EditorImage(image, image.tag)
    return EditorImage(image, tag)


def _choose(
    request: GpuRequest,
    host: Host,
    claim_store: Callable[[], ClaimStore],
    ours: Callable[[Claim], bool],
) -> tuple[Grant, list[str]]:
    """The exact GPUs for the editor, among those free now (as a run chooses them;
    claims that are `ours` count as free); on
    a host whose GPUs are unknown, the grant as a run's (nothing to claim); optional
    GPUs on a host without any: none."""
    if request.mode == "none":
        return Grant("none"), []
    if not host.gpus:
        granted = grant(request, host)
        return (Grant("none"), []) if granted.optional else (granted, [])
    store = claim_store()
    try:
        claims = [c for c in store.claims() if not ours(c)]
        granted, keys = choose(request, host, claims, unfit_gpus(host))
    except GpusBusy as busy:
        raise GpusBusy(
            f"no GPUs to write into the devcontainer: {busy.message}",
            hint="export when they are free, or name one with --gpus device=N (opening "
            "the editor then waits for nobody: it is refused while the GPU is taken)",
        ) from None
    finally:
        store.close()
    return Grant("devices", tuple(keys)), keys


@dataclass(frozen=True)
class Claimed:
    container: str
    gpus: tuple[str, ...]
    already: bool = False  # a keeper held them already (the container runs)


def claim_for_devcontainer(
    directory: str,
    engine: Engine,
    *,
    services: Services,
    view: ViewFactory,
    notice: Callable[[str], None],
    uid: int,
) -> Claimed:
    """The editor's `initializeCommand`: check the file is this user's, on this host,
    from the current lock, with its image here (built if missing); claim its GPUs and
    leave them to a keeper that holds them while its container runs.

    Claims this user's keepers hold for the container count as free: a container that
    runs with the file's GPUs keeps them (the editor reopened it); otherwise they are
    claimed anew, for a keeper that waits for the container to run with them, and an
    older keeper lets go once its grace ends (a rebuild after a new export takes other
    GPUs; a keeper in its last seconds of grace is not relied on)."""
    path = os.path.join(directory, DEVCONTAINER_PATH)
    written = read_devcontainer(path)
    _check_written(written, path, directory, uid)
    identity = None if uid == 0 else services.identity()
    spec = editor_image(directory, engine, view, identity, notice).run.spec
    ours = container_name(spec.name, spec.project_dir, uid)
    if written.container != ours:
        raise UsageError(
            f"{path} names the container {written.container}, not {ours}: gpuenv did "
            "not write that name for you and this folder",
            hint=EXPORT_AGAIN,
        )
    existing = _existing(engine, written.container)
    claimed = Claimed(written.container, written.gpus, already=True)
    if written.gpus and not _kept(existing, written, services, uid):
        claimed = _claim(written, spec.name, services, notice, uid)
    if existing is not None and not existing[0] and not _same_export(existing[1], written):
        engine.remove(written.container)
        notice(
            f"removed the stopped container {written.container}, made from an earlier "
            "export: the editor makes it again from the file"
        )
    return claimed if written.gpus else Claimed(written.container, ())


def _existing(engine: Engine, name: str) -> tuple[bool, dict[str, str]] | None:
    """Whether the container called `name` runs, and its labels; None when there is none."""
    try:
        details = engine.inspect(name)
    except EngineRefused as exc:
        if exc.status == 404:
            return None
        raise
    running = bool((details.get("State") or {}).get("Running"))
    return running, (details.get("Config") or {}).get("Labels") or {}


def _same_export(labels: dict[str, str], written: Written) -> bool:
    """Whether a container was made from this file: its lock, and its GPUs."""
    return labels.get("io.gpuenv.lock") == written.lock and (
        not written.gpus or labels.get("io.gpuenv.gpus") == ",".join(written.gpus)
    )


def _kept(
    existing: tuple[bool, dict[str, str]] | None, written: Written, services: Services, uid: int
) -> bool:
    """Whether the file's GPUs are held already: its container runs with them, and
    this user's live claims for it (its keeper's) hold every one."""
    if existing is None or not existing[0] or not _same_export(existing[1], written):
        return False
    store = services.claim_store()
    try:
        held = {c.gpu for c in store.claims() if c.uid == uid and c.run == written.container}
    finally:
        store.close()
    return set(written.gpus) <= held


def _claim(
    written: Written,
    project: str,
    services: Services,
    notice: Callable[[str], None],
    uid: int,
) -> Claimed:
    """Claim the file's GPUs (this user's claims for the container count as free) and
    hand them to a keeper that holds them while the container runs with them."""
    store = services.claim_store()
    try:
        host = services.detect_host()
        request = GpuRequest("devices", devices=written.gpus)
        try:
            _, claims = reserve(
                store,
                request,
                host,
                project,
                None,
                notice,
                unfit_gpus(host),
                ignoring=lambda c: c.uid == uid and c.run == written.container,
            )
        except GpusBusy as busy:
            raise GpusBusy(
                f"the devcontainer's GPUs are taken: {busy.message}",
                hint=f"wait for them (`gpuenv top`), or {EXPORT_AGAIN} to take free ones",
            ) from None
        with store.locked():
            handed = store.transfer(claims, written.container, written.container)
        spawn_keeper(
            written.container,
            store.held_descriptors(handed),
            handed,
            store.directory,
            named=True,
        )
        store.forget(handed)
    finally:
        store.close()
    return Claimed(written.container, written.gpus)


def _check_written(written: Written, path: str, directory: str, uid: int) -> None:
    stale = stale_against_lock(written, directory)
    if stale:
        raise LockError(f"{path}: {stale}", hint=EXPORT_AGAIN)
    if written.uid != uid:
        raise UsageError(
            f"{path} was written for uid {written.uid}, and you are uid {uid}: its "
            "container would run as someone else",
            hint=EXPORT_AGAIN,
        )
    if written.host != socket.gethostname():
        raise UsageError(
            f"{path} was written on {written.host}, and this is {socket.gethostname()}: "
            "the GPUs it names are that host's",
            hint=EXPORT_AGAIN,
        )
