"""The benchmark's own logic, without an engine: targets met or not, the described
host it runs on, the samples it takes."""

from __future__ import annotations

import doctest
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from gpuenv.host.hostfile import load_host_file

from ..conftest import REPO


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench", Path(REPO) / "bench" / "bench.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench"] = module
    spec.loader.exec_module(module)
    return module


def test_doctests(bench: ModuleType) -> None:
    assert doctest.testmod(bench).failed == 0


@pytest.mark.parametrize(
    ("value", "baseline", "limit", "met", "ratio"),
    [
        (0.150, 0.100, 1.5, True, "1.50×"),
        (0.151, 0.100, 1.5, False, "1.51×"),
        (0.125, 0.100, 1.25, True, "1.25×"),
        (0.099, 0.100, 1.0, True, "0.99×"),
        (0.101, 0.100, 1.0, False, "1.01×"),
        (0.101, 0.100, None, None, "1.01×"),
        (0.101, 0.0, 1.0, None, "-"),
    ],
)
def test_targets(
    bench: ModuleType,
    value: float,
    baseline: float,
    limit: float | None,
    met: bool | None,
    ratio: str,
) -> None:
    row = bench.Row("x", value, "y", baseline, "target" if limit else "", limit)
    assert row.met is met
    assert row.cells()[4] == ratio
    assert row.cells()[6] == {True: "yes", False: "no", None: ""}[met]


def test_the_described_host_is_one_gpuenv_reads(bench: ModuleType, tmp_path: Path) -> None:
    host = load_host_file(str(bench.describe_host(tmp_path / "host.json")))
    assert str(host.driver) == "550.54.15"
    assert [gpu.uuid for gpu in host.gpus] == [bench.gpu_uuid(i) for i in range(4)]
    assert len(set(bench.gpu_uuid(i) for i in range(4))) == 4


def test_setup_runs_before_every_timed_sample(bench: ModuleType) -> None:
    events: list[str] = []
    bench.median_seconds(lambda: events.append("run"), runs=3, setup=lambda: events.append("setup"))
    assert events == ["run", "setup", "run", "setup", "run", "setup", "run"]


def test_paired_samples_alternate(bench: ModuleType) -> None:
    events: list[str] = []
    ours, theirs = bench.paired_medians(
        lambda: events.append("gpuenv"), lambda: events.append("docker"), runs=2
    )
    assert events == ["gpuenv", "docker"] * 3  # one warm-up each, then in turns
    assert ours >= 0 and theirs >= 0


@pytest.mark.parametrize("section", ["docker_rows", "user_run_rows", "dependency_rows"])
def test_engine_sections_wait_for_the_services(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch, section: str
) -> None:
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    rows, _ = getattr(bench, section)()
    assert rows == []


def test_the_synthetic_resolve_row_resolves_on_its_host(bench: ModuleType, tmp_path: Path) -> None:
    """What the resolve() row times is a resolution that succeeds, on a small matrix."""
    resolution = bench.synthetic_resolution(48, tmp_path)()
    assert resolution.row.framework == "pytorch" and resolution.row.tag.startswith("t")
    assert str(resolution.host.driver) == "575.51.03"
