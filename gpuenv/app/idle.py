"""`gpuenv idle`: one round of GPU samples kept in the state folder, for how long each
claimed GPU has been idle, and, run by root with the admin's policy, the warnings and
stops that policy asks for."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuenv.engine.protocol import Engine
from gpuenv.errors import UsageError
from gpuenv.host.detect import detect_host
from gpuenv.monitoring.idle import (
    IdlePolicy,
    enforce,
    idle_for,
    load_policy,
    record_name,
    update,
)
from gpuenv.reservations.claims import ClaimStore

DEFAULT_THRESHOLD = 5  # percent: without a policy, below this a GPU counts as idle


@dataclass(frozen=True)
class IdleReport:
    """The admin's policy (None: there is none) and `source`, where it came from or why
    there is none; each claim with its GPU's idle time, the policy's log, and what
    enforcing did."""

    policy: IdlePolicy | None
    source: str
    claims: list[dict[str, Any]]
    log: list[dict[str, Any]]
    done: list[str]


def check_idle(connect: Callable[[], Engine], *, enforcing: bool) -> IdleReport:
    """Sample every GPU once (the samples are the caller's record in the state folder),
    then, when `enforcing` (root, with the admin's policy), warn or stop the runs idle
    too long. `connect` makes the engine, once the policy is read."""
    policy, source = load_policy()
    engine = connect()
    me = os.getuid()
    if enforcing and me != 0:
        raise UsageError(
            "only root enforces the idle policy", hint="run `sudo gpuenv idle --enforce`"
        )
    if enforcing and policy is None:
        raise UsageError(f"no idle policy to enforce: {source}")
    store = ClaimStore()
    try:
        now = time.time()
        state = store.read_record(record_name(me), [me]) or {}
        done = []
        with store.locked():
            if enforcing and policy is not None:
                done = [text for _, text in enforce(store, engine, _sample, policy, now, state)]
            else:
                update(state, _sample(), now, policy.threshold if policy else DEFAULT_THRESHOLD)
            store.write_record(record_name(me), state)
            claims = store.claims()
    finally:
        store.close()
    rows = [
        {
            "gpu": claim.gpu,
            "user": claim.user,
            "project": claim.project,
            "holder": claim.container[:12] or f"pid {claim.pid}",
            "idle_seconds": idle_for(state, claim.gpu, now),
        }
        for claim in claims
    ]
    return IdleReport(policy, source, rows, list(state.get("log") or []), done)


def _sample() -> dict[str, int | None]:
    return {gpu.key: gpu.utilization for gpu in detect_host().gpus}
