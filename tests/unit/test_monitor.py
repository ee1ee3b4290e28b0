from __future__ import annotations

import os
import time

from gpuenv.common.versions import DriverVersion
from gpuenv.host.machine import Gpu, GpuProcess, Host
from gpuenv.host.procfs import process_start
from gpuenv.monitoring.monitor import container_of, gpu_rows, runs_from
from gpuenv.reservations.claims import Claim

CONTAINER = "a" * 64


def containers() -> list[dict]:
    return [
        {
            "Id": CONTAINER,
            "Names": ["/brave_turing"],
            "Image": "gpuenv/demo:1",
            "State": "running",
            "Labels": {
                "io.gpuenv.run": "1",
                "io.gpuenv.project": "demo",
                "io.gpuenv.user": "alice (1000)",
                "io.gpuenv.gpus": "GPU-1",
                "io.gpuenv.command": "python3 train.py",
                "io.gpuenv.started": time.strftime(
                    "%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 65)
                ),
                "io.gpuenv.pid": "123",
            },
        },
        {"Id": "b" * 64, "Labels": {"other": "x"}},
    ]


def test_runs_from_labels() -> None:
    (run,) = runs_from(containers())
    assert (run.name, run.project, run.user, run.uid, run.gpus) == (
        "brave_turing",
        "demo",
        "alice (1000)",
        1000,
        "GPU-1",
    )
    assert run.uptime in ("1m05s", "1m06s", "1m04s")


def test_gpu_rows_attribute_claims_and_processes(monkeypatch) -> None:
    monkeypatch.setattr(
        "gpuenv.monitoring.monitor.container_of", lambda pid: CONTAINER if pid == 4242 else None
    )
    monkeypatch.setattr("gpuenv.monitoring.monitor.process_owner", lambda pid: "bob")
    host = Host(
        DriverVersion.parse("550.54.15"),
        (
            Gpu(0, "NVIDIA A100-SXM4-80GB", uuid="GPU-0", processes=(GpuProcess(777, 900),)),
            Gpu(
                1,
                "NVIDIA A100-SXM4-80GB",
                uuid="GPU-1",
                utilization=97,
                processes=(GpuProcess(4242, 30000),),
            ),
        ),
        "test",
    )
    claim = Claim(
        "GPU-1",
        "alice",
        1000,
        os.getpid(),
        process_start(os.getpid()),
        os.uname().nodename,
        "demo",
        time.time(),
    )
    rows = gpu_rows(host, [claim], runs_from(containers()))
    assert rows[0].claimed_by is None
    assert rows[0].users == [
        {"pid": 777, "memory_mib": 900, "gpuenv": False, "container": None, "user": "bob"}
    ]
    assert rows[1].claimed_by == {"user": "alice", "project": "demo", "pid": os.getpid()}
    assert rows[1].users[0]["gpuenv"] is True and rows[1].users[0]["run"] == "brave_turing"


def test_container_of_a_missing_process() -> None:
    assert container_of(2**22 + 17) is None
