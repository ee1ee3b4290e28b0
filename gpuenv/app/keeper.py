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
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from gpuenv.engine.protocol import ContainerEngine
from gpuenv.errors import EngineRefused, GpuenvError
from gpuenv.sharing.claims import HEARTBEAT_INTERVAL, ClaimStore

RETRY = 5.0  # seconds between asks of an engine that does not answer
PATIENCE = 900.0  # an engine silent this long (removed, down for good) frees the claims


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
    result: list[int | None] = []
    ended = threading.Event()

    def watch() -> None:
        try:
            result.append(follow(engine, container, retry))
        finally:
            ended.set()

    threading.Thread(target=watch, daemon=True, name="follow").start()
    while not ended.wait(HEARTBEAT_INTERVAL):
        store.touch(names)
    store.release(names)
    return result[0] if result else None
