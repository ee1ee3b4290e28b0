"""The fake engine of the unit tests holds the engine contract's cases that every real
engine holds (tests/contract_cases.py; issue 33, item 12)."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest

from tests.contract_cases import CASES
from tests.unit.fake_engine import FakeEngine


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_the_fake_engine_holds_the_contract(case: Callable[..., None]) -> None:
    engine = FakeEngine(exit_code=3)
    made: list[str] = []

    def create(command: str) -> str:
        made.append(engine.create({"Image": "stand-in", "Cmd": ["sh", "-c", command]}))
        return made[-1]

    if len(inspect.signature(case).parameters) == 2:
        case(engine, create)
    else:
        case(engine)
