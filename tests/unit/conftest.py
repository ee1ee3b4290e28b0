from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit tests never reach a container engine: `make test` exports the test services'
    DOCKER_HOST for the integration tests, and a command such as `gpuenv lock` would
    otherwise resolve Python packages on it. Tests that need an engine pass a fake."""
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/gpuenv-unit-tests.sock")
    monkeypatch.delenv("CONTAINER_HOST", raising=False)
    monkeypatch.delenv("GPUENV_ENGINE", raising=False)
