from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuenv.common.versions import DriverVersion
from gpuenv.host.machine import Gpu, Host
from gpuenv.matrix.load import Matrix, load_matrix

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MATRICES = os.path.join(REPO, "matrices")


@pytest.fixture(scope="session")
def matrix() -> Matrix:
    return load_matrix(MATRICES, with_overlay=False)


@pytest.fixture(autouse=True)
def _isolated_env(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Tests never see the developer's host file, matrix override, matrix overlay or
    config, and never write into their cache: every user folder is the test's own (in
    a folder apart from tmp_path, which is often the project)."""
    home = tmp_path_factory.mktemp("home")
    for name in ("XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME"):
        monkeypatch.setenv(name, str(home / name.lower()))
    monkeypatch.setenv("GPUENV_CACHE_DIR", str(home / "gpuenv-cache"))
    monkeypatch.setenv("GPUENV_DATA_DIR", str(home / "gpuenv-data"))
    monkeypatch.delenv("GPUENV_CONFIG", raising=False)
    monkeypatch.delenv("GPUENV_HOST_FILE", raising=False)
    monkeypatch.delenv("GPUENV_MATRIX_DIR", raising=False)
    monkeypatch.delenv("GPUENV_DEBUG", raising=False)


def make_host(driver: str | None, *names: str, brand: str | None = None) -> Host:
    """A described host: GPU names as NVML would print them (cc from the matrix)."""
    gpus = tuple(Gpu(index=i, name=name, brand=brand) for i, name in enumerate(names))
    return Host(DriverVersion.parse(driver) if driver else None, gpus, "test")


@pytest.fixture
def host() -> Callable[..., Host]:
    return make_host


def reseal(lock_path: Path) -> None:
    """Recompute a lock's integrity digest after a test edited it, as if gpuenv had
    written the edit (tests that simulate what `pull` or `push` write)."""
    import yaml

    from gpuenv.lock.lockfile import HEADER, INTEGRITY_KEY, integrity

    data = yaml.safe_load(lock_path.read_text())
    data.pop(INTEGRITY_KEY, None)
    data[INTEGRITY_KEY] = integrity(data)
    lock_path.write_text(HEADER + yaml.safe_dump(data, sort_keys=False, width=100))


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    """The scripted NVML (tests/nvml/), loaded by this process's real nvidia-ml-py."""
    from tests.scripted_nvml import ScriptedNvml

    scripted = ScriptedNvml(tmp_path)
    scripted.load_in_process()
    for key, value in scripted.env.items():
        if key != "LD_LIBRARY_PATH":
            monkeypatch.setenv(key, value)
    return scripted
