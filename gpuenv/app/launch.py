"""`gpuenv run` and `gpuenv shell`, read top to bottom in `launch`: plan the run (the
image, built if missing; the mounts; the GPUs asked for and the host), reserve its GPUs
(claims on a shared host, kept fresh; the usage record), check the host can run the
locked image (preflight), then create, start and wait for the container, and release
what was reserved, whatever happened.

Everything the outside world provides is a parameter (the engine, the host, the claims
store, the environment, the terminal), so the whole policy runs against a fake engine
in the unit tests.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuenv.app.image import RunImage, image_for_run
from gpuenv.common.labels import USAGE_LABEL
from gpuenv.containers.config import (
    command_for,
    container_config,
    detached_labels,
    environment,
    invoking_identity,
    labels,
    without_gpus,
)
from gpuenv.containers.devices import MissingCdiDevice, detect_path, device_requests
from gpuenv.containers.publish import check_free, ssh_tunnel, urls
from gpuenv.containers.session import (
    Outcome,
    reap_orphans,
    run_container,
    start_detached,
    stdin_is_input,
)
from gpuenv.engine.protocol import Engine
from gpuenv.errors import (
    EngineRefused,
    GpuenvError,
    GpuPathBroken,
    GpuRuntimeMissing,
    UsageError,
)
from gpuenv.host.machine import Host
from gpuenv.images.accounts import Identity
from gpuenv.images.probe import can_import
from gpuenv.images.progress import ViewFactory
from gpuenv.lock.locked import Freshness
from gpuenv.monitoring.fitness import unfit_gpus
from gpuenv.monitoring.usage import UsageLog
from gpuenv.project.mounts import Bind, run_binds
from gpuenv.project.ports import Port, engine_ports, merged, parse_port
from gpuenv.project.spec import GpuRequest, parse_size
from gpuenv.project.variables import image_environment, refers, spec_with_image_env
from gpuenv.reservations.claims import HEARTBEAT_INTERVAL, STATE_ENV, ClaimStore
from gpuenv.reservations.gpus import Grant, grant, parse_gpus_option
from gpuenv.reservations.reserve import reserve
from gpuenv.reservations.statedir import state_dir

MIN_MEMORY = 6 * 1024**2  # the engine refuses less


@dataclass(frozen=True)
class RunRequest:
    """What the user asked for on the command line."""

    arguments: tuple[str, ...] = ()
    gpus: str | None = None
    env: tuple[str, ...] = ()
    env_files: tuple[str, ...] = ()
    root: bool = False
    memory: str | None = None
    wait: float | None = None  # seconds to queue for GPUs; 0: no limit; None: no queue
    force: bool = False
    shell: bool = False
    mounts: tuple[str, ...] = ()  # --mount SRC:DST[:ro|rw]
    allow_mounts: tuple[str, ...] = ()  # --allow-mount PATH
    detach: bool = False  # -d: start, hand the GPU claims to the container, return
    name: str | None = None
    freshness: Freshness = "update"  # --locked refuses a stale lock, --frozen uses it as is
    workdir: str = ""  # the folder of the project it was started in ("src"): /workspace/src
    publish: tuple[str, ...] = ()  # -p/--publish [IP:][HOST:]CONTAINER
    # (container port, the path its URL opens at): `gpuenv notebook`'s lab?token=...
    url_paths: tuple[tuple[int, str], ...] = ()
    needs_module: str = ""  # a module python3 in the image must import (jupyterlab)
    interactive: bool = True  # False: no terminal, whatever this process has


@dataclass(frozen=True)
class Terminal:
    """The invoking process's side: a terminal for both ends, stdin worth attaching,
    its uid (0 runs as root anyway)."""

    tty: bool = False
    stdin: bool = False
    uid: int = 0

    @classmethod
    def of_this_process(cls) -> Terminal:
        """This process's: a terminal when stdin and stdout both are one, stdin attached
        when it is a terminal, a pipe or a file."""
        tty = sys.stdin.isatty() and sys.stdout.isatty()
        return cls(tty=tty, stdin=tty or stdin_is_input(), uid=os.getuid())


@dataclass(frozen=True)
class Services:
    """Where a run gets its host and its claims store (real ones in the CLI)."""

    detect_host: Callable[[], Host]
    claim_store: Callable[[], ClaimStore]
    identity: Callable[[], Any] = field(default=lambda: None)
    usage_log: Callable[[], UsageLog | None] = field(default=lambda: None)


def _detect_host() -> Host:
    # NVML, nvidia-smi and host files (~40 ms of imports): only for a run that asks for GPUs.
    from gpuenv.host.detect import detect_host

    return detect_host()


def host_services() -> Services:
    """This host's services: its GPUs (detected when asked), its claims store, the
    invoking user's identity and usage log, as a run (or an editor's container) gets them."""
    return Services(
        _detect_host,
        ClaimStore,
        invoking_identity,
        usage_log=lambda: UsageLog(state_dir()),
    )


@dataclass(frozen=True)
class RunContext:
    """What every step of a run needs: the request and the world outside gpuenv."""

    request: RunRequest
    engine: Engine
    services: Services
    terminal: Terminal
    environ: Mapping[str, str]
    view: ViewFactory
    notice: Callable[[str], None]


def memory_limit(memory: str | None) -> int | None:
    """--memory SIZE in bytes (None without it); a usage error below what engines take."""
    if not memory:
        return None

    limit = parse_size(memory)
    if limit is None or limit < MIN_MEMORY:
        raise UsageError(f"--memory {memory!r}: not a size of at least 6m (e.g. 32g)")
    return limit


def oom_advice(memory: str | None) -> str:
    advice = (
        f"raise --memory (now {memory}), or lower the batch size or the DataLoader workers"
        if memory
        else "lower the batch size or the DataLoader workers, or use a bigger machine"
    )
    return f"the command was killed because it ran out of memory (OOM); {advice}"


@dataclass(frozen=True)
class RunPlan:
    """What a run was decided to be before anything is reserved or started."""

    image: RunImage
    identity: Identity | None  # who the command runs as (None: root)
    command: list[str]
    binds: list[Bind]
    gpus: GpuRequest
    host: Host
    memory: int | None
    ports: tuple[Port, ...] = ()

    @property
    def upload_identity(self) -> Identity | None:
        """The user's passwd entry and HOME to upload into the container: none when the
        user's account image has them already."""
        return self.identity if self.image.account_tag is None else None


def launch(
    directory: str,
    request: RunRequest,
    engine: Engine,
    *,
    services: Services,
    terminal: Terminal,
    environ: Mapping[str, str],
    view: ViewFactory,
    notice: Callable[[str], None],
) -> Outcome:
    """Run the request to its end; the Outcome carries the command's exit code (or, for
    a detached run, its container). What is reserved here is released whatever happens."""
    terminal = checked_terminal(request, terminal)
    run = RunContext(request, engine, services, terminal, environ, view, notice)
    plan = plan_run(run, directory)
    log = services.usage_log()
    reaped = reap(engine, log)
    reservation = reserve_gpus(run, plan, log)
    outcome: Outcome | None = None
    try:
        if not request.force and plan.host.driver is not None:
            check_host(plan, reservation.grant, notice)
        config = configure(run, plan, reservation)
        outcome = start(run, plan, config, reservation)
    finally:
        reservation.release(outcome.exit_code if outcome else None)
    for name in reaped:
        notice(f"removed {name}, left behind by a gpuenv run that was killed")
    return outcome


RUN_NAME = r"[a-zA-Z0-9][a-zA-Z0-9_.-]+"  # the names Docker and Podman take


def checked_terminal(request: RunRequest, terminal: Terminal) -> Terminal:
    """The terminal the run gets: none for a detached run, which nobody types into."""
    if request.shell and not terminal.tty:
        raise UsageError("gpuenv shell needs a terminal", hint="use `gpuenv run -- CMD` instead")
    if request.name and not request.detach:
        raise UsageError("--name names a detached run: use it with -d")
    if request.name and not re.fullmatch(RUN_NAME, request.name):
        raise UsageError(
            f"--name {request.name!r} is not a name the engine takes",
            hint="use letters, digits and . _ - (starting with a letter or digit), at "
            "least two, as `docker run --name` does",
        )
    if request.detach or not request.interactive:
        return Terminal(tty=False, stdin=False, uid=terminal.uid)
    return terminal


def reap(engine: Engine, log: UsageLog | None) -> list[str]:
    """Remove the containers of gpuenv runs that were killed (their process is gone),
    ending their usage records; the names removed."""

    def ended(label: str, exit_code: int | None, end: float | None) -> None:
        if log is not None:
            with contextlib.suppress(GpuenvError, OSError):
                log.finish_for(label, exit_code, end)

    try:
        return reap_orphans(engine, ended)
    except GpuenvError:
        return []  # the run itself reports an unreachable engine


def plan_run(run: RunContext, directory: str) -> RunPlan:
    """The run as decided from the project, the request and the host: nothing reserved."""
    request = run.request
    memory = memory_limit(request.memory)
    command = ["bash", "-l"] if request.shell else command_for(request.arguments)
    identity = None if request.root or run.terminal.uid == 0 else run.services.identity()
    image = image_for_run(
        directory, run.engine, run.view, identity, notice=run.notice, freshness=request.freshness
    )
    binds = run_binds(
        image.spec, request.mounts, request.allow_mounts, env=run.environ, notice=run.notice
    )
    if request.needs_module and not can_import(run.engine, image.tag, request.needs_module):
        raise UsageError(
            f"the project's image has no {request.needs_module} (its python3 cannot import "
            "it), and gpuenv installs nothing on its own",
            hint=f"add it to gpuenv.yaml (`packages: [{request.needs_module}]`, or a line "
            "in your requirements file), then `gpuenv lock`; NGC's framework images ship it",
        )
    gpus = parse_gpus_option(request.gpus) if request.gpus else image.spec.gpus
    ports = run_ports(image.spec.ports, request.publish, run.notice)
    # No GPUs, no need to ask NVML about them.
    host = run.services.detect_host() if gpus.mode != "none" else Host(None, (), "none")
    return RunPlan(image, identity, command, binds, gpus, host, memory, ports)


def run_ports(
    spec_ports: tuple[Port, ...], publish: Sequence[str], notice: Callable[[str], None]
) -> tuple[Port, ...]:
    """The spec's ports with -p's over them; a bad -p is a usage error (exit 2), a host
    port already taken a StartError (exit 14), both before anything is reserved. A port
    on every interface is said: anyone who reaches the host can connect to it."""
    asked = []
    for text in publish:
        try:
            asked.append(parse_port(text))
        except ValueError as exc:
            raise UsageError(f"-p {text}: {exc}") from None
    ports = merged(spec_ports, asked)
    check_free(ports)
    for port in ports:
        if port.everywhere:
            notice(
                f"port {port.container} is published on every interface ({port.address}): "
                "anyone who can reach this host can connect to it; leave the address out "
                "for 127.0.0.1 (reach it with `ssh -L`)"
            )
    return ports


class Reservation:
    """What a run holds while it runs: its GPU grant, its claims on a shared host (kept
    fresh by a heartbeat) and its usage record. `release` lets them go, unless they were
    handed over to a detached run's container, which holds them from then on."""

    def __init__(
        self,
        grant: Grant,
        store: ClaimStore | None,
        claims: list[str],
        log: UsageLog | None,
        usage_id: str | None,
    ) -> None:
        self.grant = grant
        self.store = store
        self.claims = claims
        self.log = log
        self.usage_id = usage_id
        self.container = ""  # a detached run's, once it holds the claims
        self._done = threading.Event()
        if store is not None:
            threading.Thread(target=self._heartbeat, daemon=True, name="heartbeat").start()

    @property
    def usage_label(self) -> str | None:
        """The label that ties the container to its usage record (`uid/usage id`)."""
        return f"{os.getuid()}/{self.usage_id}" if self.usage_id else None

    def _heartbeat(self) -> None:
        """Hosts sharing the state folder count a claim of this host only while its
        heartbeat is fresh."""
        assert self.store is not None
        while not self._done.wait(HEARTBEAT_INTERVAL):
            self.store.touch(list(self.claims))

    def hand_over(self, container: str, run: str = "") -> None:
        """The detached run's keeper holds the claims from now on: a process started in a
        session of its own that inherits their locks and lives as long as `container`
        (`gpuenv.app.keeper`)."""
        self._done.set()
        self.container = container
        if self.store is None or not self.claims:
            return
        with self.store.locked():
            self.claims = self.store.transfer(self.claims, container, run)
        descriptors = self.store.held_descriptors(self.claims)
        spawn_keeper(container, descriptors, self.claims, self.store.directory)
        self.store.forget(self.claims)

    def free_gpus(self) -> None:
        """The command has ended: its GPUs are free for the next run now, before its
        container is removed (the usage record ends with `release`)."""
        if self.store is not None and not self.container and self.claims:
            self.store.release(self.claims)
            self.claims = []

    def release(self, exit_code: int | None) -> None:
        """The run ended (with `exit_code`, None when it never ran): free its claims and
        end its usage record."""
        self._done.set()
        if self.store is not None and not self.container:
            self.store.release(self.claims)
        if self.log is not None and self.usage_id is not None and not self.container:
            # A started detached run's record ends with its container (the reaper).
            with contextlib.suppress(GpuenvError, OSError):
                self.log.finish(self.usage_id, exit_code)
        if self.store is not None:
            self.store.close()


def spawn_keeper(
    container: str,
    descriptors: Sequence[int],
    claims: Sequence[str],
    state: str,
    *,
    named: bool = False,
) -> None:
    """Start the keeper of a detached run's claims (`python -m gpuenv.cli.keeper`), in a
    session of its own (a closed terminal does not end it), with the claims' locked
    descriptors and this environment (the engine, the state folder); its output goes
    nowhere. Nothing of the user's is on its command line: a container id (`named`: an
    editor's container's name, which gpuenv chose) and the claim files' names."""
    subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuenv.cli.keeper",
            *(["--named"] if named else []),
            container,
            *claims,
        ],
        pass_fds=tuple(descriptors),
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd="/",
        env={**os.environ, STATE_ENV: state},
    )


def reserve_gpus(run: RunContext, plan: RunPlan, log: UsageLog | None) -> Reservation:
    """Grant the run its GPUs: on a host whose GPUs are known, claimed under the claims
    store's lock (queueing with --wait) so that two runs never share one; the usage
    record begun."""
    granted = grant(plan.gpus, plan.host)
    store, claims = None, list[str]()
    if plan.host.gpus and granted.mode != "none":
        store = run.services.claim_store()
        try:
            unfit = unfit_gpus(plan.host)  # before the lock: files and the config
            granted, claims = reserve(
                store,
                plan.gpus,
                plan.host,
                plan.image.spec.name,
                run.request.wait,
                run.notice,
                unfit,
            )
        except BaseException:
            store.close()
            raise
    used = gpus_used(granted, plan.host)
    usage_id = begin_usage(log, plan.image.spec.name, used, run.notice, run.request.detach)
    return Reservation(granted, store, claims, log, usage_id)


def check_host(plan: RunPlan, granted: Grant, notice: Callable[[str], None]) -> None:
    """The preflight: can this host's driver and granted GPUs run the locked image? A
    refusal (ResolutionError) ends the run before a container exists; warnings are said."""
    if granted.mode == "none":
        return
    # The matrix and the resolver (~60 ms of imports): only for a run with GPUs on a host
    # with a driver, not for every run.
    from gpuenv.containers.preflight import preflight
    from gpuenv.matrix.load import load_matrix

    for warning in preflight(plan.image.locked, plan.host, granted, load_matrix()):
        notice(warning)


def configure(run: RunContext, plan: RunPlan, reservation: Reservation) -> dict[str, Any]:
    """The container's create body: image, command, user, variables, labels, mounts and
    the granted GPUs as this engine takes them (without them, when they were optional and
    the engine cannot give them)."""
    request, spec, granted = run.request, plan.image.spec, reservation.grant
    image = plan.image.account_tag or plan.image.tag
    if refers(spec.env):  # `PATH: /opt/bin:$PATH`: the image's PATH, as Dockerfile ENV
        spec = spec_with_image_env(spec, image_environment(run.engine.image_config(image)))
    variables = environment(spec, request.env, request.env_files, run.environ)
    run_labels = labels(spec, plan.image.locked.lock_hash, granted, plan.identity, plan.command)
    if reservation.usage_label:
        run_labels[USAGE_LABEL] = reservation.usage_label
    if request.detach:
        run_labels = detached_labels(run_labels)
    missing: GpuRuntimeMissing | None = None
    try:
        requests = gpu_requests(run.engine, plan.host, granted, run.environ, run.notice)
    except GpuRuntimeMissing as exc:
        if not granted.optional:
            raise
        run.notice(_without_gpus_notice(exc))
        missing, requests = exc, []
    config = container_config(
        spec,
        image,
        plan.command,
        granted,
        plan.identity,
        variables,
        run_labels,
        tty=run.terminal.tty,
        stdin=run.terminal.stdin,
        binds=plan.binds,
        device_requests=requests,
        workdir=request.workdir,
    )
    if plan.memory is not None:
        config["HostConfig"]["Memory"] = plan.memory
    if plan.ports:
        exposed, bindings = engine_ports(plan.ports)
        config["ExposedPorts"] = exposed
        config["HostConfig"]["PortBindings"] = bindings
    return without_gpus(config) if missing else config


def start(
    run: RunContext, plan: RunPlan, config: dict[str, Any], reservation: Reservation
) -> Outcome:
    """Create and start the container, and for an attached run stream it and wait for
    its end; when the engine turns out not to give GPUs that were optional, run without."""
    try:
        return _start(run, plan, config, reservation)
    except GpuRuntimeMissing as exc:
        if not reservation.grant.optional:
            raise
        run.notice(_without_gpus_notice(exc))
        return _start(run, plan, without_gpus(config), reservation)


def _start(
    run: RunContext, plan: RunPlan, config: dict[str, Any], reservation: Reservation
) -> Outcome:
    if run.request.detach:
        try:
            container = start_detached(
                run.engine,
                config,
                name=run.request.name,
                identity=plan.upload_identity,
                accounts=plan.image.accounts,
                after_start=lambda container: _detached_started(run, plan, reservation, container),
            )
        except EngineRefused as exc:
            name = run.request.name
            if name and exc.status == 409 and "already in use" in exc.message:
                raise EngineRefused(
                    409,
                    f"the name {name} is taken: a container of that name exists",
                    hint=f"`gpuenv rm {name}` removes an ended run of that name (`gpuenv ps "
                    "-a` lists them), or choose another --name",
                ) from None
            raise
        return Outcome(0, oom_killed=False, container=container)
    return run_container(
        run.engine,
        config,
        identity=plan.upload_identity,
        accounts=plan.image.accounts,
        tty=run.terminal.tty,
        stdin=run.terminal.stdin,
        notice=run.notice,
        second_interrupt_kills=not run.request.shell,
        ended=reservation.free_gpus,
        started=lambda container: _say_urls(run, plan, container),
    )


def _detached_started(
    run: RunContext, plan: RunPlan, reservation: Reservation, container: str
) -> None:
    """A detached run runs: its container holds its claims from now on; its URLs said."""
    reservation.hand_over(container, run.request.name or _name_of(run.engine, container))
    _say_urls(run, plan, container)


def _say_urls(run: RunContext, plan: RunPlan, container: str) -> None:
    """Where the published ports are, as the engine chose them; over SSH, the `ssh -L`
    line that brings a loopback port to the user's computer."""
    if not plan.ports:
        return
    paths = dict(run.request.url_paths)
    shown = urls(run.engine, container)
    missing = [p for p in plan.ports if p.key not in {q.key for q in shown}]
    if missing:
        listed = ", ".join(p.key for p in missing)
        run.notice(
            f"the engine published no host port for {listed}: its containers have no "
            "network to forward to (an engine started with --bridge=none, or a Podman "
            'with netns "none"); run on an engine whose containers get a bridge network'
        )
    for port in shown:
        where = port.url() + paths.get(port.container, "") if port.protocol == "tcp" else ""
        run.notice(f"port {port.container}: {where or port}")
        tunnel = ssh_tunnel(port, run.environ)
        if tunnel:
            run.notice(f"from your computer: `{tunnel}`, then open {where}")


def _name_of(engine: Engine, container: str) -> str:
    """The name the engine gave a container, as `gpuenv ps` shows it ("" if unknown)."""
    try:
        return str(engine.inspect(container).get("Name") or "").lstrip("/")
    except GpuenvError:
        return ""


def _without_gpus_notice(exc: GpuRuntimeMissing) -> str:
    why = (
        f"the engine cannot give the GPUs through CDI ({exc.message})"
        if isinstance(exc, GpuPathBroken)
        else "no NVIDIA runtime in this Docker engine"
    )
    return f"{why}: running without GPUs (GPUs were optional)"


def gpus_used(granted: Grant, host: Host) -> list[tuple[str, str]]:
    """The granted GPUs with their models, for the usage record."""
    models = {gpu.key: gpu.name for gpu in host.gpus} | {str(g.index): g.name for g in host.gpus}
    models |= {m.uuid: f"{g.name} MIG {m.profile or '?'}" for g in host.gpus for m in g.mig_devices}
    if granted.mode == "all":
        return [(gpu.key, gpu.name) for gpu in host.gpus]
    if granted.mode == "none":
        return []
    return [(key, models.get(key, "unknown")) for key in granted.devices]


def begin_usage(
    log: UsageLog | None,
    project: str,
    gpus: list[tuple[str, str]],
    notice: Callable[[str], None],
    detached: bool = False,
) -> str | None:
    """The run's usage id; a record that cannot be written is said, and never stops
    the run."""
    if log is None:
        return None
    try:
        return log.begin(project, gpus, detached=detached)
    except (GpuenvError, OSError) as exc:
        notice(f"GPU usage not recorded: {getattr(exc, 'message', exc)}")
        return None


def gpu_requests(
    engine: Engine,
    host: Host,
    granted: Grant,
    environ: Mapping[str, str],
    notice: Callable[[str], None],
) -> list[dict[str, Any]]:
    """The grant's DeviceRequests the way this engine takes GPUs (legacy or CDI); a
    GpuPathBroken naming the spec problems when CDI cannot give them."""
    if granted.mode == "none":
        return []
    path = detect_path(engine, host, environ)
    try:
        requests = device_requests(path, granted)
    except MissingCdiDevice as exc:
        kind = "MIG instance" if str(exc).startswith("MIG-") else "GPU"
        which = "any GPU" if str(exc) == "all" else f"{kind} {exc}"
        details = "; ".join(path.problems) or "its CDI specs name no such device"
        raise GpuPathBroken(
            f"this engine takes GPUs through CDI, but no CDI device gives {which}: {details}",
            hint="`gpuenv doctor` shows the GPU path; regenerate the spec "
            "(`sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`), "
            "or run with --gpus none",
        ) from None
    for note in path.notes:
        notice(note)
    return requests
