"""`gpuenv run` and `gpuenv shell` as policy: the image (built if missing), the GPUs
(granted, and claimed on a shared host), the preflight against the driver, the
container's configuration, the start with the no-runtime fallback, and the outcome.

Everything the outside world provides is a parameter (the engine, the host, the claims
store, the environment, the terminal), so the whole policy runs against a fake engine
in the unit tests.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuenv.errors import GpuenvError, GpuRuntimeMissing, UsageError

if TYPE_CHECKING:
    from gpuenv.engine.protocol import Engine
    from gpuenv.images.build import ViewFactory
    from gpuenv.resolution.host import Host
    from gpuenv.resolution.locked import Locked
    from gpuenv.run.session import Outcome
    from gpuenv.sharing.claims import ClaimStore
    from gpuenv.sharing.gpus import Grant

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


def memory_limit(memory: str | None) -> int | None:
    """--memory SIZE in bytes (None without it); a usage error below what engines take."""
    if not memory:
        return None
    from gpuenv.project.spec import parse_size

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
    """The preflight (`container.preflight`) in a thread of its own, begun as soon as the
    grant is known: loading the matrix and judging the locked image take the time the
    engine spends creating the container. `verdict` waits for it before the start: the
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
        from gpuenv.resolution.matrix import load_matrix
        from gpuenv.run.container import preflight

        try:
            self._outcome = preflight(locked, host, granted, load_matrix())
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


def _reap(engine: Engine) -> list[str]:
    from gpuenv.run.session import reap_orphans

    try:
        return reap_orphans(engine)
    except GpuenvError:
        return []  # the run itself reports an unreachable engine


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
    from gpuenv.images.build import image_for_run
    from gpuenv.resolution.host import Host
    from gpuenv.run.container import (
        command_for,
        container_config,
        environment,
        labels,
        without_gpus,
    )
    from gpuenv.run.session import run_container
    from gpuenv.sharing.gpus import grant, parse_gpus_option

    if request.shell and not terminal.tty:
        raise UsageError("gpuenv shell needs a terminal", hint="use `gpuenv run -- CMD` instead")
    limit = memory_limit(request.memory)
    command = ["bash", "-l"] if request.shell else command_for(request.arguments)
    # Orphans of killed runs are removed alongside: it costs the run no time.
    reaped: list[str] = []
    reaper = threading.Thread(target=lambda: reaped.extend(_reap(engine)), daemon=True)
    reaper.start()
    identity = None if request.root or terminal.uid == 0 else services.identity()
    image = image_for_run(directory, engine, view, identity)
    spec, locked, tag = image.spec, image.locked, image.tag
    # The user's account image has their passwd entry and HOME already: nothing to upload.
    upload_for = identity if image.account_tag is None else None
    gpus = parse_gpus_option(request.gpus) if request.gpus else spec.gpus
    # No GPUs, no need to ask NVML about them.
    host = services.detect_host() if gpus.mode != "none" else Host(None, (), "none")
    granted = grant(gpus, host)
    store = None
    claimed: list[str] = []
    if host.gpus and granted.mode != "none":
        # A shared host: claim the GPUs under the lock before anything starts on them.
        from gpuenv.sharing.reserve import reserve

        store = services.claim_store()
        granted, claimed = reserve(store, gpus, host, spec.name, request.wait, notice)
    try:
        check = None
        if not request.force and host.driver is not None and granted.mode != "none":
            check = _Preflight(locked, host, granted, notice)
        try:
            variables = environment(spec, request.env, request.env_files, environ)
            run_labels = labels(spec, locked.lock_hash, granted, identity, command)
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
            )
        except GpuenvError:
            if check is not None:
                check.verdict()  # a refusal of the host is reported first, as it always was
            raise
        if limit is not None:
            config["HostConfig"]["Memory"] = limit

        def start(container: dict[str, Any]) -> Outcome:
            return run_container(
                engine,
                container,
                identity=upload_for,
                accounts=image.accounts,
                tty=terminal.tty,
                stdin=terminal.stdin,
                notice=notice,
                second_interrupt_kills=not request.shell,
                before_start=check.verdict if check is not None else None,
            )

        try:
            outcome = start(config)
        except GpuRuntimeMissing:
            if not granted.optional:
                raise
            notice(
                "no NVIDIA runtime in this Docker engine: running without GPUs (GPUs were optional)"
            )
            outcome = start(without_gpus(config))
        reaper.join(timeout=30)
        for name in reaped:
            notice(f"removed {name}, left behind by a gpuenv run that was killed")
        return outcome
    finally:
        if store is not None:
            store.release(claimed)
