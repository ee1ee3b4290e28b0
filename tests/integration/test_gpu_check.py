"""scripts/gpu-check.sh, the real-GPU check, run here against the scripted NVML with the
stand-in nvidia-smi (tests/standin-smi/) that answers from the same scenario: gpuenv is
installed from wheels built here into the script's own temporary venv, offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.scripted_nvml import ScriptedNvml, gpu, scenario

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SOURCES = {
    "resolve --json": [
        "name", "compute capability", "memory total", "utilization", "memory used",
        "temperature", "power", "SM clock", "memory clock", "driver",
    ],
    "doctor --json": ["driver"],
    "top --once --json": [
        "name", "memory total", "utilization", "memory used", "temperature", "power", "driver",
    ],
    "exporter": [
        "name", "driver", "utilization", "memory used", "memory total", "temperature", "power",
        "SM clock", "memory clock",
    ],
}  # fmt: skip


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gpuenv's wheel and its dependencies' (from pip's configured sources)."""
    folder = tmp_path_factory.mktemp("wheels")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "-w", str(folder), str(REPO)], check=True
    )
    assert list(folder.glob("gpuenv-*.whl"))
    return folder


def run_check(wheels: Path, tmp_path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    nvml = ScriptedNvml(tmp_path)
    nvml.write(
        scenario(
            gpu(0, utilization=97, memory_used_mib=30000, temperature_c=71, power_mw=388000,
                clocks_mhz={"sm": 1410, "memory": 1593}),
            gpu(1),
        )
    )  # fmt: skip
    env = {
        **os.environ,
        **nvml.env,
        "PATH": f"{REPO / 'tests' / 'standin-smi'}:{os.environ['PATH']}",
        "LOAD_PYTHON": str(tmp_path / "no-python"),  # no torch load here: scripted readings
        **extra,
    }
    env.pop("GPUENV_HOST_FILE", None)
    return subprocess.run(
        [str(REPO / "scripts" / "gpu-check.sh"), str(wheels)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def rows(output: str) -> dict[tuple[str, str, str], str]:
    """(GPU, reading, command) -> verdict, from the table."""
    out = {}
    for line in output.splitlines()[1:]:
        cells = [c for c in line.split("  ") if c.strip()]
        if len(cells) >= 6 and cells[0].strip().isdigit():
            out[(cells[0].strip(), cells[1].strip(), cells[2].strip())] = cells[-1].strip()
    return out


def expected() -> set[tuple[str, str, str]]:
    return {(g, r, s) for g in ("0", "1") for s, readings in SOURCES.items() for r in readings}


def test_every_reading_agrees_with_nvidia_smi(wheels: Path, tmp_path: Path) -> None:
    done = run_check(wheels, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    table = rows(done.stdout)
    assert set(table) == expected()
    assert set(table.values()) == {"ok"}
    assert "gpuenv read the GPUs through: nvml" in done.stdout
    assert "54 of 54 readings agree" in done.stdout


def test_a_reading_nvidia_smi_disagrees_with_is_marked(wheels: Path, tmp_path: Path) -> None:
    override = json.dumps({"1": {"temperature.gpu": "70", "driver_version": "999.1"}})
    done = run_check(wheels, tmp_path, GPUENV_TEST_SMI_OVERRIDE=override)
    assert done.returncode == 1, done.stdout + done.stderr
    table = rows(done.stdout)
    assert set(table) == expected()
    bad = {key for key, verdict in table.items() if verdict == "MISMATCH"}
    assert bad == {("1", "temperature", s) for s in SOURCES if "temperature" in SOURCES[s]} | {
        ("1", "driver", s) for s in SOURCES
    }
