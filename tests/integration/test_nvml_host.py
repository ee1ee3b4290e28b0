"""The shared-server tests of test_shared.py again, with the GPUs read through NVML
(the real nvidia-ml-py on the scripted libnvidia-ml.so.1, found through
LD_LIBRARY_PATH) instead of GPUENV_HOST_FILE: reservations, ps, top and doctor,
against the real engine, with a thermal slowdown, a downtrained PCIe link and a lost GPU."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.scripted_nvml import ScriptedNvml, gpu, scenario

from ..jsonschemas import validate_output
from .conftest import Project, docker, gpuenv_failed
from .test_shared import _container, _popen

pytestmark = pytest.mark.integration

UUIDS = [f"GPU-{i:08x}-1111-2222-3333-444444444444" for i in range(4)]
REMEDIES = {
    "thermal": "thermal slowdown on GPU 0 at 88 °C: check the airflow and fans (it slows down at 85 °C)",
    "pcie_width": "PCIe link of GPU 1 runs at x8, the card and slot support x16: reseat the card and check the slot and riser",
    "lost": "GPU 3 fell off the bus (NVML: GPU is lost): no run can use it",
}


def troubled(**on_two: Any) -> dict[str, Any]:
    """GPU 0 thermally throttled, GPU 1 on a downtrained link, GPU 2 fine, GPU 3 lost."""
    return scenario(
        gpu(0, utilization=99, temperature_c=88, clocks_event_reasons=0x20),
        gpu(1, pcie={"gen": 4, "max_gen": 4, "width": 8, "max_width": 16}),
        gpu(2, **on_two),
        gpu(3, lost=True),
    )


@pytest.fixture
def nvml_project(make_project, tmp_path: Path) -> tuple[Project, ScriptedNvml]:
    project = make_project(spec="gpus: 1\n")
    project.ok("build", "-q")
    scripted = ScriptedNvml(tmp_path)
    project.env.pop("GPUENV_HOST_FILE", None)
    project.env.update(scripted.env)
    project.env["GPUENV_STATE_DIR"] = str(tmp_path / "state")
    return project, scripted


def test_reservations_follow_nvml(nvml_project: tuple[Project, ScriptedNvml]) -> None:
    project, nvml = nvml_project
    nvml.write(
        scenario(
            gpu(0, processes=[{"pid": os.getpid(), "used_memory_mib": 512}]),
            gpu(1, utilization=90),
            gpu(2, utilization=10),
            gpu(3, utilization=5),
        )
    )
    result = project.ok("run", "--gpus", "2", "--", "sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES")
    assert result.stdout.strip() == f"{UUIDS[2]},{UUIDS[3]}"  # not 0 (foreign), not 1 (busiest)
    nvml.write(troubled())
    # GPU 3 fell off the bus: never granted, and naming it says so.
    two = project.ok("run", "--gpus", "3", "--", "sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES")
    assert two.stdout.strip() == ",".join(UUIDS[:3])
    refused = project.gpuenv("run", "--gpus", "device=3", "--", "true")
    assert gpuenv_failed(refused, 16) and "GPU 3: fell off the bus (GPU is lost)" in refused.stderr
    nvml.write({"init_error": "DRIVER_NOT_LOADED"})
    assert "Driver Not Loaded" in project.ok("top").stderr


def test_ps_top_and_doctor_report_health_with_remedies(
    nvml_project: tuple[Project, ScriptedNvml],
) -> None:
    project, nvml = nvml_project
    nvml.write(troubled())
    process = _popen(project, "run", "--gpus", "device=0", "--", "sleep", "300")
    try:
        container = _container(project)
        pid = int(docker("inspect", "-f", "{{.State.Pid}}", container).stdout.strip())
        data = troubled()  # the container's process on GPU 0, as NVML lists host pids
        data["gpus"][0]["processes"] = [{"pid": pid, "used_memory_mib": 30000}]
        nvml.write(data)
        snapshot = validate_output("top", project.ok("top", "--once", "--json").stdout)
        assert snapshot["host"]["source"] == "nvml"
        rows = {row["index"]: row for row in snapshot["gpus"]}
        (user,) = rows[0]["users"]
        assert user["gpuenv"] is True and user["container"] == container[:12], (user, container)
        assert [h["kind"] for h in rows[0]["health"]] == ["thermal"]
        assert [h["kind"] for h in rows[1]["health"]] == ["pcie_width"]
        assert rows[2]["health"] == []
        assert [(h["kind"], h["severity"]) for h in rows[3]["health"]] == [("lost", "fail")]
        top = project.ok("top", "--once", COLUMNS="250")
        for line in REMEDIES.values():
            assert line in top.stderr  # findings are messages; the rows stay on stdout
        assert "unusable" in top.stdout
        runs = [
            r
            for r in validate_output("ps", project.ok("ps", "--json").stdout)
            if r["project"] == project.name
        ]
        assert len(runs) == 1, f"the run is gone: {process.poll()} {docker('ps', '-a').stdout}"
        run = runs[0]
        assert [(h["kind"], h["gpu"]) for h in run["health"]] == [("thermal", 0)]
        listed = project.ok("ps", COLUMNS="250")
        listing = listed.stdout + listed.stderr
        assert f"{run['name']}: {REMEDIES['thermal']}" in listing
        doctor = project.gpuenv("doctor", "--json")
        assert doctor.returncode == 15  # the lost GPU fails
        checks = [(c["name"], c["status"], c["detail"]) for c in json.loads(doctor.stdout)]
        assert ("GPU 0 health", "warn", "thermal slowdown on GPU 0 at 88 °C") in checks
        assert ("GPU 1 health", "warn", REMEDIES["pcie_width"].split(":")[0]) in checks
        assert ("GPU 3 health", "fail", "GPU 3 fell off the bus (NVML: GPU is lost)") in checks
        driver = next(c for c in json.loads(doctor.stdout) if c["name"] == "NVIDIA driver")
        assert "detected through NVML" in driver["detail"]
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
    nvml.write(scenario(gpu(0), gpu(1)))
    healthy = json.loads(project.ok("doctor", "--json").stdout)
    assert {
        "name": "GPU health",
        "status": "ok",
        "detail": "2 GPUs: no slowdown, link, ECC or bus problem NVML reports",
        "remedy": "",
    } in healthy


def test_an_old_driver_nvml_reports_is_refused_before_starting(
    nvml_project: tuple[Project, ScriptedNvml],
) -> None:
    """The twin of test_run's host-file case: the driver as NVML reports it."""
    project, nvml = nvml_project
    nvml.write(
        scenario(
            gpu(0, name="NVIDIA GeForce RTX 4090", brand=15, compute_capability="8.9"),
            driver="535.104.05",
            cuda=12020,
        )
    )
    result = project.gpuenv("run", "--", "true")
    assert gpuenv_failed(result, 4)
    assert "needs driver ≥ 545 (this host has 535.104.05)" in result.stderr
    assert project.gpuenv("run", "--force", "--", "true").returncode == 0
