"""A non-editable install from a built wheel, in a fresh virtual environment, run from
another folder: the matrices and templates must travel inside the wheel."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wheel")
    dist = root / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(REPO)],
        check=True,
    )
    (wheel,) = dist.glob("gpuenv-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "gpuenv/_data/matrices/ngc-pytorch.yaml" in names
    assert "gpuenv/_data/matrices/gpus.yaml" in names
    assert "gpuenv/_data/images/README.md" in names
    # The schema of every --json output ships as package data (docs/reference/scripting.md).
    shipped = {name for name in names if name.startswith("gpuenv/schemas/")}
    assert {f"gpuenv/schemas/{n}.json" for n in ("error", "check", "lock", "resolve")} <= shipped
    # the dashboard's page and the monitoring data files
    for name in (
        "gpuenv/cli/static/index.html",
        "gpuenv/cli/static/dashboard.js",
        "gpuenv/cli/static/dashboard.css",
        "gpuenv/schemas/dashboard-gpus.json",
        "gpuenv/monitoring/alert_rules.yml",
        "gpuenv/monitoring/dcgm_xid_messages.json",
    ):
        assert name in names, name
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)], check=True)
    return venv / "bin" / "gpuenv"


def gpuenv(binary: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binary), *args], cwd=cwd, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}
    )


def test_runs_from_any_folder(installed: Path, tmp_path: Path) -> None:
    version = gpuenv(installed, tmp_path, "--version")
    assert version.returncode == 0 and "gpuenv, version" in version.stdout
    summary = json.loads(gpuenv(installed, tmp_path, "matrix", "--json").stdout)
    assert "/site-packages/gpuenv/_data/matrices" in summary["directory"]
    assert summary["images"]["pytorch"] > 50


def test_resolve_and_init_from_the_wheel(installed: Path, tmp_path: Path) -> None:
    result = gpuenv(
        installed,
        tmp_path,
        "resolve",
        "--framework",
        "pytorch",
        "--version",
        "2.4",
        "--driver",
        "550.54.15",
        "--gpu",
        "RTX 4090",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    assert (
        json.loads(result.stdout)["image"] == "nvcr.io/nvidia/pytorch:24.06-py3"
    )  # 545+ (Triton rel-24-06)
    (tmp_path / "requirements.txt").write_text("torch==2.4.0\n")
    init = gpuenv(installed, tmp_path, "init", "--driver", "550.54.15", "--gpu", "RTX 4090")
    assert init.returncode == 0, init.stderr
    assert (tmp_path / "gpuenv.lock").exists()
    # No engine here: the lock is valid and says its Python packages are not locked yet.
    assert "lock the Python packages in the base image" in init.stderr
    checked = gpuenv(installed, tmp_path, "lock", "--check")
    assert checked.returncode == 5
    assert "the Python packages on the image are not locked" in checked.stderr
    relocked = gpuenv(installed, tmp_path, "lock")
    assert relocked.returncode == 0 and "no container engine answers" in relocked.stderr
    bad = gpuenv(installed, tmp_path, "resolve", "--cuda", "12.x")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
