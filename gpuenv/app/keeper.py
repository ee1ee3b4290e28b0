"""A detached run's keeper: the small process that holds its GPU claims for as long as its
container runs, and lets them go when it ends.

`gpuenv run -d` exits once the container has started. Its claims must outlive it, and
count for every user of the server, whatever engine each can reach: with one rootless
engine per user, nobody else can ask the owner's engine whether the container runs. So
the claims stay what every claim is, a file whose write lock a live process holds, and
the keeper (`python -m gpuenv.cli.keeper`, started in a session of its own) inherits the
locked descriptors. It follows the container through its owner's engine (`wait`) and
releases the claims when the container ends, is removed, or the engine says it is gone;
an engine that does not answer (restarting, stopped) keeps them held and is asked again.
If the keeper itself is killed the kernel drops the locks, as for a killed run: the
GPUs are free for the next command.

An editor's container (`gpuenv export devcontainer`) is held the same way, by name: its
claims are taken before the editor's tools create or start it, so its keeper waits for
it to run, and holds them across a rebuild (`keep_named`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence

from gpuenv.engine.protocol import ContainerEngine
from gpuenv.errors import EngineRefused, GpuenvError
from gpuenv.reservations.claims import CLAIM_PREFIX, HEARTBEAT_INTERVAL, ClaimStore

RETRY = 5.0  # seconds between asks of an engine that does not answer
PATIENCE = 900.0  # an engine silent this long (removed, down for good) frees the claims
START_PATIENCE = 300.0  # an editor's container not running this long after its claim: freed
GRACE = 15.0  # an editor's container replaced (rebuilt) within this keeps its claims


def is_claim_name(name: str) -> bool:
    """Whether `name` names a claim file (in the state folder, never a path)."""
    return name.startswith(CLAIM_PREFIX) and "/" not in name


def hold_claims(
    engine: ContainerEngine, container: str, names: Sequence[str], *, named: bool
) -> int:
    """The keeper's work: hold the claims `names` (their locks inherited) while
    `container` runs (`keep`), or, `named`, for the editor's container of that name
    (`keep_named`), then release them: 0. Where the state folder cannot be opened the
    locks are held all the same while it runs, then dropped with the process: 1 (the
    files stay, dead: the owner's next command deletes them)."""
    try:
        store = ClaimStore()
    except GpuenvError:
        if named:
            follow_named(engine, container, START_PATIENCE, GRACE, 1.0)
        else:
            follow(engine, container)
        return 1
    if named:
        keep_named(engine, container, store, names)
    else:
        keep(engine, container, store, names)
    return 0


def follow(
    engine: ContainerEngine, container: str, retry: float = RETRY, patience: float = PATIENCE
) -> int | None:
    """Wait for `container` to end: its exit code, or None when the engine says it is
    gone. An engine that cannot be asked is asked again (a restart), for `patience`
    seconds at most: one that never answers again frees the claims rather than hold
    the GPUs for ever."""
    silent_since: float | None = None
    while True:
        try:
            return engine.wait(container)
        except EngineRefused as exc:
            if exc.status == 404:
                return None
        except GpuenvError:
            silent_since = silent_since or time.monotonic()
            if time.monotonic() - silent_since > patience:
                return None
        time.sleep(retry)


def keep(
    engine: ContainerEngine,
    container: str,
    store: ClaimStore,
    names: Sequence[str],
    retry: float = RETRY,
) -> int | None:
    """Hold the claims `names` (this process inherited their locks) while `container`
    runs, refreshing their heartbeat; release them when it ends. Its exit code, or None."""
    return _hold(store, names, lambda: follow(engine, container, retry))


def keep_named(
    engine: ContainerEngine,
    name: str,
    store: ClaimStore,
    names: Sequence[str],
    patience: float = START_PATIENCE,
    grace: float = GRACE,
    poll: float = 1.0,
) -> int | None:
    """Hold the claims `names` for the container called `name`, which another program
    (an editor's Dev Containers tools) creates or starts after they were taken: while
    one of that name runs with their GPUs (its `io.gpuenv.gpus` label names one of
    them), and while one runs again within `grace` seconds of the last ending (an
    editor rebuilding it removes it and makes a new one). A container of that name
    with other GPUs (made from a later export) is not theirs. Released when none has
    run for `patience` seconds after the claims were taken (the editor failed to start
    it, or reopened the old one), or `grace` seconds after the last one ended."""
    gpus = frozenset(_gpus_of(store, names))
    return _hold(store, names, lambda: follow_named(engine, name, patience, grace, poll, gpus))


def _gpus_of(store: ClaimStore, names: Sequence[str]) -> set[str]:
    """The GPUs our claims `names` hold, as their records say."""
    records = (store.read_record(name, [os.getuid()]) for name in names)
    return {str(record.get("gpu")) for record in records if record}


def follow_named(
    engine: ContainerEngine,
    name: str,
    patience: float,
    grace: float,
    poll: float,
    gpus: frozenset[str] | None = None,
) -> int | None:
    """Follow the containers called `name` (with one of `gpus`, when given) as
    `keep_named` says; the last exit code."""
    deadline = time.monotonic() + patience
    last: int | None = None
    while time.monotonic() < deadline:
        if _running(engine, name, gpus):
            last = follow(engine, name)
            deadline = time.monotonic() + grace
            continue
        time.sleep(poll)
    return last


def _running(engine: ContainerEngine, name: str, gpus: frozenset[str] | None) -> bool:
    """Whether a container called `name` runs now, with one of `gpus` when given (an
    engine that does not answer: no)."""
    try:
        details = engine.inspect(name)
    except GpuenvError:
        return False
    if not (details.get("State") or {}).get("Running"):
        return False
    if gpus is None:
        return True
    labels = (details.get("Config") or {}).get("Labels") or {}
    return bool(gpus & set(str(labels.get("io.gpuenv.gpus") or "").split(",")))


def _hold(
    store: ClaimStore, names: Sequence[str], watch_until_ended: Callable[[], int | None]
) -> int | None:
    """Refresh the claims' heartbeat until `watch_until_ended` returns, then release."""
    result: list[int | None] = []
    ended = threading.Event()

    def watch() -> None:
        try:
            result.append(watch_until_ended())
        finally:
            ended.set()

    threading.Thread(target=watch, daemon=True, name="follow").start()
    while not ended.wait(HEARTBEAT_INTERVAL):
        store.touch(names)
    store.release(names)
    return result[0] if result else None
