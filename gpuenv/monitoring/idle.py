"""Idle claims: for how long each claimed GPU has been below a utilization threshold,
and the admin's policy for runs that hold GPUs they do not use (off by default).

Pure: utilization samples come from a `Sampler` (the host detection in the CLI, a
script in the tests), time from a clock, and the state is a dict the caller keeps in
the state folder (`idle.json`, trusted only when root, or the folder's owner, wrote it).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpuenv.common.labels import RUN_LABEL
from gpuenv.common.siteconfig import read_site_config, seconds
from gpuenv.common.units import duration
from gpuenv.engine.protocol import ContainerEngine
from gpuenv.errors import GpuenvError, UsageError
from gpuenv.monitoring.monitor import user_uid
from gpuenv.reservations.claims import Claim, ClaimStore

MAX_GAP = 600.0  # samples further apart than this say nothing about the time between

# GPU key -> utilization in percent (None: unknown)
Sampler = Callable[[], Mapping[str, int | None]]


@dataclass(frozen=True)
class IdlePolicy:
    """`[idle]` in the host-wide config: below `threshold` % for `warn_after` seconds
    warns the owner; still idle `stop_after` seconds after the warning stops the run."""

    threshold: int
    warn_after: float
    stop_after: float


def load_policy(env: Mapping[str, str] | None = None) -> tuple[IdlePolicy | None, str]:
    """The admin's policy and where it came from; (None, why) when there is none. The
    file must be root's and writable by root only: a user cannot write policy."""
    site = read_site_config(env)
    path, data = site.path, site.data
    if site.missing:
        return None, f"no {path}: idle runs are not warned or stopped"
    if data is None:
        return None, site.why
    section = data.get("idle")
    if not isinstance(section, dict) or not section.get("enabled", True):
        return None, f"{path} has no [idle] policy"
    threshold = section.get("threshold", 5)
    if not isinstance(threshold, int) or not 0 < threshold <= 100:
        raise UsageError(f"{path}: [idle] threshold = {threshold!r} is not a percentage (1-100)")
    policy = IdlePolicy(
        threshold,
        seconds(section.get("warn_after", "2h"), "idle", "warn_after", path),
        seconds(section.get("stop_after", "30m"), "idle", "stop_after", path),
    )
    return policy, path


def update(
    state: dict[str, Any], samples: Mapping[str, int | None], now: float, threshold: int
) -> None:
    """Fold one round of samples into `state["gpus"]`: per GPU, since when it has been
    below `threshold` (None: busy, or unknown) and when it was last seen."""
    gpus: dict[str, Any] = state.setdefault("gpus", {})
    for key, utilization in samples.items():
        entry = gpus.get(key) or {}
        seen = entry.get("seen")
        since = entry.get("since")
        if utilization is None or utilization >= threshold:
            since = None
        elif since is None or seen is None or now - seen > MAX_GAP:
            since = now  # idle from now on: nothing is known of the gap before
        gpus[key] = {"since": since, "seen": now}


def idle_for(state: Mapping[str, Any], key: str, now: float) -> float | None:
    """Seconds GPU `key` has been idle, None when it is not (or not known to be)."""
    entry = (state.get("gpus") or {}).get(key) or {}
    since, seen = entry.get("since"), entry.get("seen")
    if since is None or seen is None or now - seen > MAX_GAP:
        return None
    return float(now - since)


@dataclass(frozen=True)
class Action:
    kind: str  # "warn" | "stop"
    holder: str  # the claim's container, or "pid N"
    user: str
    project: str
    gpus: tuple[str, ...]
    idle: float  # seconds, the shortest over the run's GPUs
    uid: int = -1  # the claims' owner, from their files (fstat), never from their content
    pid_start: str = ""  # the claiming process's start time, as its claim recorded it

    def reason(self, policy: IdlePolicy) -> str:
        return (
            f"GPUs {', '.join(self.gpus)} of {self.user}'s run "
            f"({self.project}, {self.holder[:12]}) "
            f"below {policy.threshold}% for {duration(self.idle)}"
        )


def decide(
    policy: IdlePolicy, claims: Sequence[Claim], state: dict[str, Any], now: float
) -> list[Action]:
    """What the policy does now, recording warnings in `state["warned"]`: a run whose
    every GPU has been idle `warn_after` is warned once; idle still `stop_after` after
    its warning, it is stopped. A run that worked again is forgiven."""
    runs: dict[str, list[Claim]] = {}
    for claim in claims:
        runs.setdefault(claim.container or f"pid {claim.pid}", []).append(claim)
    warned: dict[str, float] = state.setdefault("warned", {})
    actions = []
    for holder, held in runs.items():
        idles = [idle_for(state, c.gpu, now) for c in held]
        idle = None if any(i is None for i in idles) else min(i for i in idles if i is not None)
        if idle is None or idle < policy.warn_after:
            warned.pop(holder, None)
            continue
        first = held[0]
        gpus = tuple(c.gpu for c in held)
        action = Action(
            "warn", holder, first.user, first.project, gpus, idle, first.uid, first.pid_start
        )
        if holder not in warned:
            warned[holder] = now
            actions.append(action)
        elif now - warned[holder] >= policy.stop_after:
            actions.append(replace(action, kind="stop"))
    return actions


def record_name(uid: int) -> str:
    return f"idle.{uid}.json"


def stop_holder(engine: ContainerEngine, action: Action, hostname: str) -> str | None:
    """Stop the run behind an action: a detached run's container, or the container of
    the gpuenv process named by the claim (its own `gpuenv run` then releases them).
    Only a run of the claims' owner, on this host, is stopped: a claim's content is
    written by its owner, who could name another user's container or process."""

    def owned(labels: Mapping[str, str]) -> bool:
        return user_uid(dict(labels)) == action.uid and labels.get("io.gpuenv.host") == hostname

    if not action.holder.startswith("pid "):
        try:
            labels = (engine.inspect(action.holder).get("Config") or {}).get("Labels") or {}
        except GpuenvError:
            return None  # gone already
        if not owned(labels):
            return None
        engine.stop(action.holder, 10)
        return action.holder
    pid = action.holder.removeprefix("pid ")
    for container in engine.containers(RUN_LABEL, all=False):
        labels = container.get("Labels") or {}
        if (
            labels.get("io.gpuenv.pid") == pid
            and labels.get("io.gpuenv.pid-start", "") == action.pid_start
            and owned(labels)
        ):
            engine.stop(str(container["Id"]), 10)
            return str(container["Id"])
    return None


def enforce(
    store: ClaimStore,
    engine: ContainerEngine,
    sampler: Sampler,
    policy: IdlePolicy,
    now: float,
    state: dict[str, Any],
) -> list[tuple[Action, str]]:
    """One round of the policy: sample, decide, warn or stop; each action with what
    was done, recorded in `state["log"]` (why a run was stopped stays on record)."""
    update(state, sampler(), now, policy.threshold)
    done = []
    for action in decide(policy, store.claims(), state, now):
        reason = action.reason(policy)
        if action.kind == "warn":
            outcome = f"warned: {reason}; stopped in {duration(policy.stop_after)} if still idle"
        else:
            stopped = stop_holder(engine, action, store.hostname)
            outcome = f"stopped {stopped[:12]}: {reason}" if stopped else f"not found: {reason}"
        state.setdefault("log", []).append({"at": now, "kind": action.kind, "what": outcome})
        state["log"] = state["log"][-200:]
        done.append((action, outcome))
    return done


def known_state(store: ClaimStore) -> dict[str, Any]:
    """The idle samples to show: root's (the enforcer's) where it keeps them, else ours."""
    for owner in dict.fromkeys((0, os.getuid())):
        record = store.read_record(record_name(owner), [owner])
        if record:
            return record
    return {}


def run_idle(state: Mapping[str, Any], gpus: str, now: float) -> float | None:
    """A run's idle time: the shortest of its GPUs' (`gpus` as its label has them)."""
    times = [idle_for(state, key, now) for key in gpus.split(",") if key]
    if not times or any(t is None for t in times):
        return None
    return min(t for t in times if t is not None)
