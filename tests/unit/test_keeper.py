"""A detached run's keeper (issue 33, item 1): it holds the claims it inherited while the
container runs, through an engine that restarts meanwhile, and lets them go when the
container ends or the engine says it is gone."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpuenv.app.keeper import follow, keep
from gpuenv.errors import EngineError, EngineRefused
from gpuenv.reservations.claims import ClaimStore
from tests.unit.fake_engine import FakeEngine


class Following(FakeEngine):
    """An engine whose `wait` blocks until the test ends the container, after failing
    as an engine that restarts would, `unreachable` times."""

    def __init__(self, unreachable: int = 0, gone: bool = False) -> None:
        super().__init__()
        self.ended = threading.Event()
        self.unreachable = unreachable
        self.gone = gone

    def wait(self, container: str) -> int:
        self._record("wait", container)
        if self.unreachable:
            self.unreachable -= 1
            raise EngineError("cannot reach the engine")
        if self.gone:
            raise EngineRefused(404, f"No such container: {container}")
        self.ended.wait(30)
        return 3


def test_follow_asks_an_engine_that_restarts_again() -> None:
    engine = Following(unreachable=2)
    engine.ended.set()
    assert follow(engine, "c1", retry=0.01) == 3
    assert len([c for c in engine.calls if c[0] == "wait"]) == 3


def test_follow_ends_when_the_engine_says_the_container_is_gone() -> None:
    assert follow(Following(gone=True), "c1", retry=0.01) is None


def test_keep_holds_until_the_container_ends(tmp_path: Path) -> None:
    store = ClaimStore(str(tmp_path / "state"))
    with store.locked():
        handed = store.transfer(store.add(["GPU-0"], "mine"), "c1")
    engine = Following()
    kept: list[int | None] = []
    keeper = threading.Thread(target=lambda: kept.append(keep(engine, "c1", store, handed)))
    keeper.start()
    other = ClaimStore(str(tmp_path / "state"))
    assert [c.container for c in other.claims()] == ["c1"]  # held while it runs
    engine.ended.set()  # the container's command ends
    keeper.join(10)
    assert kept == [3] and other.claims() == []
    assert not (Path(store.directory) / handed[0]).exists()


def test_the_keeper_process_holds_the_claims_it_inherits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real spawn: `python -m gpuenv.cli.keeper` in a session of its own holds the
    claims after the launching process let go of them; killed, it frees them (as a
    killed run does)."""
    from tests.unit import conftest

    monkeypatch.undo()  # the real spawn_keeper, not the in-process stand-in
    import gpuenv.app.launch as run_module

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/gpuenv-unit-tests.sock")
    spawned: list[subprocess.Popen[bytes]] = []
    real_popen = subprocess.Popen
    monkeypatch.setattr(
        run_module.subprocess,
        "Popen",
        lambda *a, **k: spawned.append(real_popen(*a, **k)) or spawned[-1],  # type: ignore[func-returns-value]
    )
    monkeypatch.setenv("PYTHONPATH", str(Path(conftest.__file__).resolve().parents[2]))
    store = ClaimStore(str(tmp_path / "state"))
    with store.locked():
        handed = store.transfer(store.add(["GPU-0"], "mine"), "c1")
    run_module.spawn_keeper("c1", store.held_descriptors(handed), handed, store.directory)
    store.forget(handed)
    try:
        assert [c.container for c in ClaimStore(str(tmp_path / "state")).claims()] == ["c1"]
        (process,) = spawned
        assert process.poll() is None and os.getsid(process.pid) == process.pid
    finally:
        for process in spawned:
            process.kill()
            process.wait(10)
    assert ClaimStore(str(tmp_path / "state")).claims() == []
    assert sys.executable == spawned[0].args[0]


def test_an_engine_that_never_answers_again_frees_the_claims() -> None:
    engine = Following(unreachable=10_000)
    assert follow(engine, "c1", retry=0.01, patience=0.1) is None
