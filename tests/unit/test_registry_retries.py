"""A pull or push the registry fails for a moment (429, 5xx) is asked again with backoff,
bounded; any other failure is said at once (issue 33, item 6). The engine reports the
registry's answer as an error event, as Docker does (`toomanyrequests: …`)."""

from __future__ import annotations

import pytest

from gpuenv.errors import GpuenvWarning, PullError
from gpuenv.images import service
from tests.unit.fake_engine import FakeEngine, _NoView

BUSY = "toomanyrequests: You have reached your pull rate limit"
FAILING = "received unexpected HTTP status: 503 Service Unavailable"


def pull(engine: FakeEngine) -> object:
    return service.with_retries(
        lambda: service.consume_pull(engine.pull("r/x", "1", None), "r/x:1", _NoView()),
        "pull of r/x:1",
    )


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(service.time, "sleep", slept.append)
    return slept


@pytest.mark.parametrize("errors", [[BUSY], [FAILING, BUSY], [FAILING, FAILING, FAILING]])
def test_a_busy_registry_is_asked_again(errors: list[str], no_waiting: list[float]) -> None:
    engine = FakeEngine(pull_errors=list(errors))
    with pytest.warns(GpuenvWarning, match="failed for a moment") as said:
        pull(engine)
    assert len([c for c in engine.calls if c[0] == "pull"]) == len(errors) + 1
    assert no_waiting == [2.0, 4.0, 8.0][: len(errors)]  # exponential backoff
    assert "trying again in 2 s (1 of 3)" in str(said[0].message)


def test_retries_are_bounded(no_waiting: list[float]) -> None:
    engine = FakeEngine(pull_errors=[FAILING] * 10)
    with pytest.warns(GpuenvWarning), pytest.raises(PullError, match="503"):
        pull(engine)
    assert len([c for c in engine.calls if c[0] == "pull"]) == 4  # once, then 3 retries
    assert len(engine.pull_errors) == 6


@pytest.mark.parametrize("error", ["manifest unknown", "unauthorized: authentication required"])
def test_other_failures_are_not_retried(error: str, no_waiting: list[float]) -> None:
    engine = FakeEngine(pull_errors=[error])
    with pytest.raises(PullError):
        pull(engine)
    assert no_waiting == [] and len([c for c in engine.calls if c[0] == "pull"]) == 1
