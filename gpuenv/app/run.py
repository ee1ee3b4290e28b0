"""`gpuenv run` and `gpuenv shell` as policy: the image (built if missing), the GPUs
(granted, and claimed on a shared host), the preflight against the driver, the
container's configuration, the start with the no-runtime fallback, and the outcome.

Everything the outside world provides is a parameter (the engine, the host, the claims
store, the environment, the terminal), so the whole policy runs against a fake engine
in the unit tests.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuenv.app.build import ViewFactory, image_for_run
from gpuenv.common.labels import USAGE_LABEL
from gpuenv.engine.protocol import Engine
from gpuenv.errors import GpuenvError, GpuPathBroken, GpuRuntimeMissing, UsageError
from gpuenv.host.machine import Host
from gpuenv.lock.locked import Locked
from gpuenv.project.mounts import run_binds
from gpuenv.project.spec import parse_size
from gpuenv.run.container import (
    command_for,
    container_config,
    detached_labels,
    environment,
    labels,
    without_gpus,
)
from gpuenv.run.devices import (
    EngineFacts,
    MissingCdiDevice,
    detect_path,
    device_requests,
    engine_facts,
)
from gpuenv.run.preflight import judge
from gpuenv.run.session import Outcome, reap_orphans, run_container, start_detached
from gpuenv.sharing.claims import HEARTBEAT_INTERVAL, ClaimStore
from gpuenv.sharing.gpus import Grant, grant, parse_gpus_option
from gpuenv.sharing.holders import container_check
from gpuenv.sharing.reserve import reserve
from gpuenv.sharing.usage import UsageLog

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


@dataclass(frozen=True)
class Terminal:
    """The invoking process's side: a terminal for both ends, stdin worth attaching,
    its uid (0 runs as root anyway)."""

    tty: bool = False
    stdin: bool = False
    uid: int = 0


@dataclass(frozen=True)
class Services:
    """Where a run gets its host and its claims store (real ones in the CLI)."""

    detect_host: Callable[[], Host]
    claim_store: Callable[[], ClaimStore]
    identity: Callable[[], Any] = field(default=lambda: None)
    usage_log: Callable[[], UsageLog | None] = field(default=lambda: None)


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


class _Preflight:
    """The preflight (`run.preflight.judge`) in a thread of its own, begun as soon as the
    grant is known: judging the locked image (or reading the verdict back) takes the
    time the engine spends creating the container. `verdict` waits for it before the start: the
    refusal (the container, created but never started, is then removed) or the warnings,
    said once."""

    def __init__(
        self, locked: Locked, host: Host, granted: Grant, notice: Callable[[str], None]
    ) -> None:
        self._notice = notice
        self._outcome: list[str] | BaseException = []
        self._said = False
        self._thread = threading.Thread(
            target=self._judge, args=(locked, host, granted), daemon=True
        )
        self._thread.start()

    def _judge(self, locked: Locked, host: Host, granted: Grant) -> None:
        try:
            self._outcome = judge(locked, host, granted)
        except BaseException as exc:
            self._outcome = exc

    def verdict(self) -> None:
        self._thread.join()
        if isinstance(self._outcome, BaseException):
            raise self._outcome
        if not self._said:
            self._said = True
            for warning in self._outcome:
                self._notice(warning)


class _Facts:
    """The engine's facts for the GPU path (`devices.engine_facts`: GET /version, and
    /info on Docker 25+), asked in a thread of its own from the start of the run: the
    answer is there when the container's GPUs are chosen. What the request raised is
    raised where the facts are needed, as if they had been asked then."""

    def __init__(self, engine: Engine) -> None:
        self._outcome: EngineFacts | BaseException | None = None
        self._thread = threading.Thread(target=self._ask, args=(engine,), daemon=True)
        self._thread.start()

    def _ask(self, engine: Engine) -> None:
        try:
            self._outcome = engine_facts(engine)
        except BaseException as exc:
            self._outcome = exc

    def get(self) -> EngineFacts:
        self._thread.join()
        if isinstance(self._outcome, BaseException):
            raise self._outcome
        assert self._outcome is not None
        return self._outcome


def _reap(engine: Engine, log: UsageLog | None) -> list[str]:
    def ended(label: str, exit_code: int | None, end: float | None) -> None:
        if log is not None:
            with contextlib.suppress(GpuenvError, OSError):
                log.finish_for(label, exit_code, end)

    try:
        return reap_orphans(engine, ended)
    except GpuenvError:
        return []  # the run itself reports an unreachable engine


def _gpus_used(granted: Grant, host: Host) -> list[tuple[str, str]]:
    """The granted GPUs with their models, for the usage record."""
    models = {gpu.key: gpu.name for gpu in host.gpus} | {str(g.index): g.name for g in host.gpus}
    models |= {m.uuid: f"{g.name} MIG {m.profile or '?'}" for g in host.gpus for m in g.mig_devices}
    if granted.mode == "all":
        return [(gpu.key, gpu.name) for gpu in host.gpus]
    if granted.mode == "none":
        return []
    return [(key, models.get(key, "unknown")) for key in granted.devices]


def _begin_usage(
    log: UsageLog | None,
    project: str,
    gpus: list[tuple[str, str]],
    notice: Callable[[str], None],
    detached: bool = False,
) -> tuple[str | None, str | None]:
    """The run's usage id and its container label; a record that cannot be written is
    said, and never stops the run."""
    if log is None:
        return None, None
    try:
        usage_id = log.begin(project, gpus, detached=detached)
    except (GpuenvError, OSError) as exc:
        notice(f"GPU usage not recorded: {getattr(exc, 'message', exc)}")
        return None, None
    return usage_id, f"{os.getuid()}/{usage_id}"


def gpu_requests(
    engine: Engine,
    host: Host,
    granted: Grant,
    environ: Mapping[str, str],
    notice: Callable[[str], None],
    facts: Callable[[], EngineFacts] | None = None,
) -> list[dict[str, Any]]:
    """The grant's DeviceRequests the way this engine takes GPUs (legacy or CDI); a
    GpuPathBroken naming the spec problems when CDI cannot give them. `facts` gives the
    engine's facts when they were asked beforehand."""
    if granted.mode == "none":
        return []

    path = detect_path(engine, host, environ, facts() if facts else None)
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
    """Run the request to its end; the Outcome carries the command's exit code. GPU
    claims made here are released whatever happens."""
    if request.shell and not terminal.tty:
        raise UsageError("gpuenv shell needs a terminal", hint="use `gpuenv run -- CMD` instead")
    if request.name and not request.detach:
        raise UsageError("--name names a detached run: use it with -d")
    if request.detach:
        # Nobody is there to type into a run that outlives its terminal.
        terminal = Terminal(tty=False, stdin=False, uid=terminal.uid)
    limit = memory_limit(request.memory)
    command = ["bash", "-l"] if request.shell else command_for(request.arguments)
    # Orphans of killed runs are removed alongside: it costs the run no time.
    reaped: list[str] = []
    log = services.usage_log()
    reaper = threading.Thread(target=lambda: reaped.extend(_reap(engine, log)), daemon=True)
    reaper.start()
    # Asked now, answered by the time the GPUs are chosen (one round trip less in line).
    facts = _Facts(engine) if request.gpus != "none" else None
    identity = None if request.root or terminal.uid == 0 else services.identity()
    image = image_for_run(directory, engine, view, identity)
    spec, locked, tag = image.spec, image.locked, image.tag
    # The user's account image has their passwd entry and HOME already: nothing to upload.
    upload_for = identity if image.account_tag is None else None

    binds = run_binds(spec, request.mounts, request.allow_mounts, env=environ, notice=notice)
    gpus = parse_gpus_option(request.gpus) if request.gpus else spec.gpus
    # No GPUs, no need to ask NVML about them.
    host = services.detect_host() if gpus.mode != "none" else Host(None, (), "none")
    granted = grant(gpus, host)
    store = None
    claimed: list[str] = []
    if host.gpus and granted.mode != "none":
        # A shared host: claim the GPUs under the lock before anything starts on them.

        store = services.claim_store()
        store.container_check = container_check(engine)
        granted, claimed = reserve(store, gpus, host, spec.name, request.wait, notice)
    usage_id, usage_label = _begin_usage(
        log, spec.name, _gpus_used(granted, host), notice, detached=request.detach
    )
    outcome: Outcome | None = None
    beating = threading.Event()
    if store is not None and not request.detach:
        threading.Thread(
            target=_heartbeat, args=(store, claimed, beating), daemon=True, name="heartbeat"
        ).start()
    started = ""
    try:
        check = None
        if not request.force and host.driver is not None and granted.mode != "none":
            check = _Preflight(locked, host, granted, notice)
        gpus_missing: GpuRuntimeMissing | None = None
        try:
            variables = environment(spec, request.env, request.env_files, environ)
            run_labels = labels(spec, locked.lock_hash, granted, identity, command)
            if usage_label:
                run_labels[USAGE_LABEL] = usage_label
            if request.detach:
                run_labels = detached_labels(run_labels)
            try:
                requests = gpu_requests(
                    engine, host, granted, environ, notice, facts.get if facts else None
                )
            except GpuRuntimeMissing as exc:
                if not granted.optional:
                    raise
                gpus_missing, requests = exc, []
            config = container_config(
                spec,
                image.account_tag or tag,
                command,
                granted,
                identity,
                variables,
                run_labels,
                tty=terminal.tty,
                stdin=terminal.stdin,
                binds=binds,
                device_requests=requests,
            )
        except GpuenvError:
            if check is not None:
                check.verdict()  # a refusal of the host is reported first, as it always was
            raise
        if limit is not None:
            config["HostConfig"]["Memory"] = limit

        def verdict() -> None:
            if check is not None:
                check.verdict()

        def hand_over(container: str) -> None:
            if store is not None:
                with store.locked():
                    claimed[:] = store.transfer(claimed, container)

        def start(container: dict[str, Any]) -> Outcome:
            try:
                return start_now(container)
            except GpuenvError:
                verdict()  # a refusal of the host is the error reported, as it always was
                raise

        def start_now(container: dict[str, Any]) -> Outcome:
            nonlocal started
            if request.detach:
                started = start_detached(
                    engine,
                    container,
                    name=request.name,
                    identity=upload_for,
                    accounts=image.accounts,
                    before_start=verdict,
                    after_start=hand_over,
                )
                return Outcome(0, False, False, container=started)
            return run_container(
                engine,
                container,
                identity=upload_for,
                accounts=image.accounts,
                tty=terminal.tty,
                stdin=terminal.stdin,
                notice=notice,
                second_interrupt_kills=not request.shell,
                before_start=verdict if check is not None else None,
            )

        try:
            if gpus_missing is not None:
                verdict()
                raise gpus_missing
            outcome = start(config)
        except GpuRuntimeMissing as exc:
            if not granted.optional:
                raise
            why = (
                f"the engine cannot give the GPUs through CDI ({exc.message})"
                if isinstance(exc, GpuPathBroken)
                else "no NVIDIA runtime in this Docker engine"
            )
            notice(f"{why}: running without GPUs (GPUs were optional)")
            outcome = start(without_gpus(config))
        reaper.join(timeout=30)
        for name in reaped:
            notice(f"removed {name}, left behind by a gpuenv run that was killed")
        return outcome
    finally:
        beating.set()
        if store is not None and not started:
            store.release(claimed)
        if log is not None and usage_id is not None and not started:
            # A started detached run's record ends with its container (the reaper).
            with contextlib.suppress(GpuenvError, OSError):
                log.finish(usage_id, outcome.exit_code if outcome else None)
        if store is not None:
            store.close()


def _heartbeat(store: ClaimStore, claims: list[str], done: threading.Event) -> None:
    """Refresh the run's claims while it runs: hosts sharing the state folder count a
    claim of this host only while its heartbeat is fresh."""
    while not done.wait(HEARTBEAT_INTERVAL):
        store.touch(list(claims))
