from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import pytest


@pytest.fixture(autouse=True)
def _no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit tests never reach a container engine: `make test` exports the test services'
    DOCKER_HOST for the integration tests, and a command such as `gpuenv lock` would
    otherwise resolve Python packages on it. Tests that need an engine pass a fake."""
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/gpuenv-unit-tests.sock")
    monkeypatch.delenv("CONTAINER_HOST", raising=False)
    monkeypatch.delenv("GPUENV_ENGINE", raising=False)


class Keepers:
    """Detached runs' keepers, in this process: each holds a copy of its claims' locked
    descriptors (so the claims count, as with a real keeper) until the test ends its
    container (`end`), as the real keeper releases them when its container ends."""

    def __init__(self) -> None:
        self.held: dict[str, tuple[list[int], list[str], str]] = {}

    def spawn(
        self, container: str, descriptors: Sequence[int], claims: Sequence[str], state: str
    ) -> None:
        self.held[container] = ([os.dup(fd) for fd in descriptors], list(claims), state)

    def end(self, container: str) -> None:
        from gpuenv.reservations.claims import ClaimStore

        descriptors, claims, state = self.held.pop(container)
        store = ClaimStore(state)
        store.release(claims)
        store.close()
        for fd in descriptors:
            os.close(fd)

    def close(self) -> None:
        for descriptors, _, _ in self.held.values():
            for fd in descriptors:
                os.close(fd)


@pytest.fixture(autouse=True)
def keepers(monkeypatch: pytest.MonkeyPatch) -> Iterator[Keepers]:
    """A detached run's keeper is a process (`python -m gpuenv.cli.keeper`) that follows
    its container on the real engine; unit tests keep it here, on their fake engine."""
    kept = Keepers()
    monkeypatch.setattr("gpuenv.app.launch.spawn_keeper", kept.spawn)
    yield kept
    kept.close()
