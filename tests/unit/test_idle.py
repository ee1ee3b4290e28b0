"""The idle-claims policy with an injected clock and scripted utilization: idle time
per GPU, the warning, the stop, forgiveness, and the policy file's trust rules."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest

from gpuenv.errors import UsageError
from gpuenv.monitoring.idle import (
    MAX_GAP,
    IdlePolicy,
    decide,
    enforce,
    idle_for,
    load_policy,
    update,
)
from gpuenv.reservations.claims import ClaimStore
from tests.unit.fake_engine import FakeEngine

POLICY = IdlePolicy(threshold=5, warn_after=3600, stop_after=1800)


@pytest.mark.parametrize(
    ("script", "idle"),
    [
        ([(0, 0), (60, 1), (120, 2)], 120.0),  # idle all along
        ([(0, 0), (60, 50), (120, 2)], 0.0),  # busy at 60: idle again from 120
        ([(0, 0), (60, 5), (120, 2)], 0.0),  # the threshold itself is not idle
        ([(0, 0), (60, None), (120, 0)], 0.0),  # unknown breaks the streak
        ([(0, 0), (60 + MAX_GAP + 1, 0)], 0.0),  # a gap: nothing known in between
        ([(0, 90)], None),  # busy
    ],
)
def test_idle_time_follows_the_samples(
    script: list[tuple[float, int | None]], idle: float | None
) -> None:
    state: dict[str, Any] = {}
    for now, utilization in script:
        update(state, {"GPU-0": utilization}, now, POLICY.threshold)
    assert idle_for(state, "GPU-0", script[-1][0]) == idle


def test_a_sample_too_old_says_nothing() -> None:
    state: dict[str, Any] = {}
    update(state, {"GPU-0": 0}, 0, 5)
    assert idle_for(state, "GPU-0", MAX_GAP + 1) is None


def _store(tmp_path: Path) -> ClaimStore:
    """Detached runs' claims are held by this process here, as their keeper holds them."""
    return ClaimStore(str(tmp_path / "state"))


def test_warn_then_stop_then_forgive(tmp_path: Path) -> None:
    store = _store(tmp_path)
    with store.locked():
        names = store.add(["GPU-0", "GPU-1"], "train")
        store.transfer(names, "c1")
    state: dict[str, Any] = {}
    clock = 0.0

    def tick(minutes: float, load: dict[str, int]) -> list[str]:
        nonlocal clock
        for _ in range(int(minutes)):
            clock += 60
            update(state, load, clock, POLICY.threshold)
        return [a.kind for a in decide(POLICY, store.claims(), state, clock)]

    idle = {"GPU-0": 0, "GPU-1": 1}
    assert tick(60, idle) == []  # idle since the first sample: 59 minutes
    assert tick(1, idle) == ["warn"]  # an hour idle: warned once
    assert tick(29, idle) == []
    assert tick(1, idle) == ["stop"]  # half an hour after the warning
    # One GPU busy: the run is not idle, and its warning is forgiven.
    assert tick(1, {"GPU-0": 0, "GPU-1": 80}) == []
    assert state["warned"] == {}


class LabelledEngine(FakeEngine):
    """A fake engine whose containers' labels are given (as `docker inspect` shows them)."""

    def __init__(self, labels: dict[str, dict[str, str]]) -> None:
        super().__init__()
        self.labels = labels

    def inspect(self, container: str) -> dict[str, Any]:
        if container not in self.labels:
            return super().inspect(container)
        return {"Config": {"Labels": self.labels[container]}, "State": {"Running": True}}


def _run_labels(uid: int, pid: int) -> dict[str, str]:
    from gpuenv.host.procfs import process_start

    return {
        "io.gpuenv.pid": str(pid),
        "io.gpuenv.pid-start": process_start(pid),
        "io.gpuenv.host": socket.gethostname(),
        "io.gpuenv.user": f"someone ({uid})",
    }


def test_enforce_stops_detached_and_attached_runs(tmp_path: Path) -> None:
    mine = _run_labels(os.getuid(), os.getpid())
    engine = LabelledEngine({"c9": mine})
    store = _store(tmp_path)
    with store.locked():
        store.transfer(store.add(["GPU-0"], "detached"), "c9")
        store.add(["GPU-1"], "attached")  # held by this process
    engine.listed = [{"Id": "attached-container", "Labels": mine}]
    state: dict[str, Any] = {}
    policy = IdlePolicy(5, warn_after=60, stop_after=60)
    for minute in range(4):
        done = enforce(
            store, engine, lambda: {"GPU-0": 0, "GPU-1": 0}, policy, minute * 60.0, state
        )
        if minute == 1:
            assert sorted(a.kind for a, _ in done) == ["warn", "warn"]
        if minute == 2:
            assert sorted(a.kind for a, _ in done) == ["stop", "stop"]
    stopped = {args[0] for name, args in engine.calls if name == "stop"}
    assert stopped == {"c9", "attached-container"}
    assert any("below 5% for 2m00s" in entry["what"] for entry in state["log"])


def test_the_policy_is_off_without_a_root_file(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    assert load_policy({"GPUENV_SYSTEM_CONFIG": str(path)})[0] is None
    path.write_text('[idle]\nthreshold = 10\nwarn_after = "2h"\nstop_after = 900\n')
    path.chmod(0o644)
    policy, source = load_policy({"GPUENV_SYSTEM_CONFIG": str(path)})
    assert policy == IdlePolicy(10, 7200.0, 900.0) and source == str(path)
    path.chmod(0o666)
    policy, why = load_policy({"GPUENV_SYSTEM_CONFIG": str(path)})
    assert policy is None and "others may write it" in why
    path.chmod(0o644)
    path.write_text('[idle]\nwarn_after = "soon"\n')
    with pytest.raises(UsageError, match="is not a duration"):
        load_policy({"GPUENV_SYSTEM_CONFIG": str(path)})
    path.write_text("[idle]\nenabled = false\n")
    assert load_policy({"GPUENV_SYSTEM_CONFIG": str(path)})[0] is None


def test_a_claim_never_gets_another_users_run_stopped(tmp_path: Path) -> None:
    """A claim's content is its owner's to write: one that names another user's
    container, or whose pid is that of another user's gpuenv, stops nothing of theirs."""
    victim = _run_labels(4242, os.getpid())  # the claim's pid, but another user's run
    engine = LabelledEngine({"c7": victim})
    store = _store(tmp_path)
    with store.locked():
        store.transfer(store.add(["GPU-0"], "forged"), "c7")  # names the victim's container
        store.add(["GPU-1"], "forged")  # its pid matches the victim's run's label
    engine.listed = [{"Id": "victim-container", "Labels": victim}]
    state: dict[str, Any] = {}
    policy = IdlePolicy(5, warn_after=60, stop_after=60)
    for minute in range(4):
        enforce(store, engine, lambda: {"GPU-0": 0, "GPU-1": 0}, policy, minute * 60.0, state)
    assert not [call for call in engine.calls if call[0] == "stop"]
