"""The engine contract's cases that the core relies on everywhere, written once and run
on every real engine (tests/integration/test_engine_contract.py) and on the fake engine
the unit tests use (tests/unit/test_fake_engine_contract.py), so that the fake never
answers what no engine would (issue 33, item 12).

Each case takes the engine and a way to make a container that runs `sh -c COMMAND` of
an image the engine has."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from gpuenv.engine.protocol import Engine
from gpuenv.errors import EngineError, EngineRefused

Create = Callable[[str], str]


def refusal(call: Callable[[], object]) -> EngineRefused:
    """A refusal is EngineRefused (exit 10) with the engine's HTTP status, never a
    library's exception."""
    with pytest.raises(EngineError) as raised:
        call()
    assert type(raised.value) is EngineRefused, repr(raised.value)
    assert isinstance(raised.value.status, int) and raised.value.status >= 400
    assert raised.value.exit_code == 10
    return raised.value


def absent_images_are_absent(engine: Engine) -> None:
    """What the image checks answer for an image the engine does not have: no error."""
    absent = f"itest-contract/absent-{uuid.uuid4().hex[:8]}:never"
    assert engine.has_image(absent) is False
    assert engine.image_config(absent) is None
    assert engine.repo_digests(absent) == []


def a_missing_container_is_404_or_nothing_to_do(engine: Engine) -> None:
    """Calls on a container that is not there: 404 where the core must know, nothing
    where there is nothing to do (kill, remove)."""
    missing = f"itest-contract-missing-{uuid.uuid4().hex[:8]}"
    for call in (
        lambda: engine.start(missing),
        lambda: engine.inspect(missing),
        lambda: engine.wait(missing),
        lambda: list(engine.logs(missing, follow=False)),
        lambda: engine.put_archive(missing, "/tmp", b""),
    ):
        assert refusal(call).status == 404
    engine.kill(missing, "SIGTERM")
    engine.remove(missing)


def a_container_runs_to_its_exit_code(engine: Engine, create: Create) -> None:
    """create, start, wait: the command's exit code, which inspect reports too; removed,
    the container is gone (404)."""
    container = create("exit 3")
    assert engine.inspect(container)["State"]["Running"] is False
    engine.start(container)
    assert engine.wait(container) == 3
    state = engine.inspect(container)["State"]
    assert state["ExitCode"] == 3 and state["Running"] is False
    engine.remove(container)
    assert refusal(lambda: engine.inspect(container)).status == 404


def a_file_not_in_a_container_is_none(engine: Engine, create: Create) -> None:
    container = create("true")
    assert engine.get_archive(container, "/no/such/path") is None


CASES = (
    absent_images_are_absent,
    a_missing_container_is_404_or_nothing_to_do,
    a_container_runs_to_its_exit_code,
    a_file_not_in_a_container_is_none,
)
