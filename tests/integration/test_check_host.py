"""`gpuenv check` judges the lock against the host it detects (issue 22, item 8): the
installed CLI with the scripted NVML library (tests/nvml) in place of the driver's."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scripted_nvml import ScriptedNvml, gpu, scenario

from .conftest import Project

pytestmark = pytest.mark.integration


def test_check_judges_the_lock_against_the_host_nvml_reports(make_project, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    project: Project = make_project()  # locked for PyTorch 24.06 (driver 550.54.15)
    scripted = ScriptedNvml(tmp_path)
    project.env.pop("GPUENV_HOST_FILE", None)
    project.env.update(scripted.env)
    # An A100 on R450: below 24.06's minimum (545) and not one of its forward-compatible
    # branches (matrices/ngc-pytorch.yaml: 470.57, 525.85, 535.86).
    scripted.write(scenario(gpu(0), driver="450.80.02", cuda=11000))
    refused = project.gpuenv("check")
    assert refused.returncode == 4, refused.stdout + refused.stderr
    said = " ".join(refused.stderr.split())
    assert "this host cannot run the locked image nvcr.io/nvidia/pytorch:24.06-py3" in said
    assert "detected through NVML" in said and "needs driver ≥ 545" in said
    assert "✓ host" not in refused.stderr

    scripted.write(scenario(gpu(0), driver="550.54.15"))
    fits = project.ok("check")
    assert "✓ host: nvcr.io/nvidia/pytorch:24.06-py3 runs on driver 550.54.15" in fits.stderr
    assert scripted.calls(), "the scripted NVML was not read"
