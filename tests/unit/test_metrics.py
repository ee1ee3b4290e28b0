"""The exporter's samples (gpuenv/monitoring/metrics.py) and its collector, read through
prometheus_client's own text format, on the scripted NVML."""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry, generate_latest

from gpuenv.cli.tree import main
from gpuenv.common.versions import DriverVersion
from gpuenv.host.machine import Gpu, Host
from gpuenv.monitoring.metrics import Holder, families, holders
from gpuenv.monitoring.monitor import runs_from
from gpuenv.reservations.claims import Claim
from tests.scripted_nvml import ScriptedNvml, gpu, scenario
from tests.unit.test_monitor import containers


def test_holders_prefer_the_run_over_the_claim() -> None:
    claims = [
        Claim("GPU-1", "alice", 1000, 1, "1", "h", "demo", time.time()),
        Claim("GPU-2", "bob", 1001, 2, "2", "h", "other", time.time()),
    ]
    held = holders(claims, runs_from(containers()))
    assert held == {
        "GPU-1": Holder("demo", "alice", "brave_turing"),
        "GPU-2": Holder("other", "bob", ""),
    }


def test_families_label_every_gpu_and_bound_their_labels() -> None:
    host = Host(
        DriverVersion.parse("550.54.15"),
        (
            Gpu(
                0,
                "A100",
                uuid="GPU-0",
                utilization=50,
                temperature_c=87,
                slowdown_temperature_c=85,
                clocks_event_reasons=0x20 | 0x1,
                ecc_uncorrected=0,
                sm_clock_mhz=1100,
            ),
            Gpu(1, "unknown (lost)", lost="GPU is lost"),
        ),
        "nvml",
    )
    out = {
        f.name: f
        for f in families(host, {"GPU-0": Holder("demo", "alice", "brave_turing")}, {(0, 79): 2})
    }
    labels = ("0", "GPU-0", "demo", "alice", "brave_turing")
    assert out["gpuenv_gpu_utilization_ratio"].samples == [(labels, 0.5)]
    assert out["gpuenv_gpu_sm_clock_hertz"].samples == [(labels, 1.1e9)]
    assert out["gpuenv_gpu_up"].samples == [(labels, 1), (("1", "", "", "", ""), 0)]
    reasons = dict((s[0][-1], s[1]) for s in out["gpuenv_gpu_clocks_event_reason"].samples)
    assert (
        reasons["sw_thermal_slowdown"] == reasons["gpu_idle"] == 1 and reasons["sw_power_cap"] == 0
    )
    health = [s[0][-2:] for s in out["gpuenv_gpu_health_problem"].samples]
    assert health == [("xid", "fail"), ("thermal", "warn"), ("lost", "fail")] or health == [
        ("thermal", "warn"),
        ("lost", "fail"),
    ]
    assert out["gpuenv_gpu_xid_errors"].samples == [((*labels, "79"), 2)]
    for family in out.values():  # no pid, no command line: only these labels
        assert set(family.labels) <= {
            "gpu",
            "uuid",
            "project",
            "user",
            "run",
            "name",
            "driver",
            "reason",
            "type",
            "kind",
            "severity",
            "xid",
            "mig_uuid",  # at most 7 MIG instances per GPU
            "profile",
        }


def test_the_collector_serves_nvml_readings(nvml: ScriptedNvml, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from prometheus_client import generate_latest
    from prometheus_client.core import CollectorRegistry

    from gpuenv.app.exporter import GpuReadings
    from gpuenv.cli.context import Application
    from gpuenv.cli.exporter import GpuCollector

    monkeypatch.setenv("GPUENV_STATE_DIR", str(nvml.path.parent / "state"))
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent.sock")  # no engine: claims only
    nvml.write(
        scenario(
            gpu(0, temperature_c=88, clocks_event_reasons=0x20),
            gpu(1, pcie={"gen": 4, "max_gen": 4, "width": 8, "max_width": 16}),
            gpu(2, lost=True),
        )
    )
    readings = GpuReadings(Application().engine)
    readings.start()
    try:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(GpuCollector(readings))
        nvml.write(
            scenario(
                gpu(0, temperature_c=88, clocks_event_reasons=0x20, xids=[79]),
                gpu(1, pcie={"gen": 4, "max_gen": 4, "width": 8, "max_width": 16}),
                gpu(2, lost=True),
            )
        )
        text = generate_latest(registry).decode()
    finally:
        readings.stop()
    uuid0 = "GPU-00000000-1111-2222-3333-444444444444"
    uuid1 = "GPU-00000001-1111-2222-3333-444444444444"
    assert "gpuenv_exporter_nvml_up 1.0" in text
    assert (
        f'gpuenv_gpu_temperature_celsius{{gpu="0",project="",run="",user="",uuid="{uuid0}"}} 88.0'
        in text
    )
    assert (
        f'gpuenv_gpu_health_problem{{gpu="0",kind="thermal",project="",run="",severity="warn",user="",uuid="{uuid0}"}} 1.0'
        in text
    )
    assert (
        f'gpuenv_gpu_health_problem{{gpu="1",kind="pcie_width",project="",run="",severity="warn",user="",uuid="{uuid1}"}} 1.0'
        in text
    )
    assert 'gpuenv_gpu_up{gpu="2",project="",run="",user="",uuid=""} 0.0' in text
    assert (
        f'gpuenv_gpu_xid_errors_total{{gpu="0",project="",run="",user="",uuid="{uuid0}",xid="79"}} 1.0'
        in text
    )


def test_mig_instances_are_samples_with_their_holder() -> None:
    from tests.unit.test_mig import M00, M01, M02, mig_host

    held = holders([Claim(M01, "alice", 1000, 1, "1", "h", "demo", time.time())], [])
    (mig,) = [f for f in families(mig_host(), held, {}) if f.name == "gpuenv_gpu_mig_instance"]
    assert mig.samples == [
        (("0", M00, "1g.10gb", "", "", ""), 1),
        (("0", M01, "1g.10gb", "demo", "alice", ""), 1),
        (("0", M02, "2g.20gb", "", "", ""), 1),
    ]


def test_a_host_file_is_served_with_its_xids_and_nvml_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A described host is not NVML: nvml_up is 0 (an alert on it never reads a file as a
    healthy driver); the file's XIDs are exported; cumulative counts end in _total."""
    from gpuenv.app.exporter import GpuReadings
    from gpuenv.cli.context import Application
    from gpuenv.cli.exporter import GpuCollector

    described = tmp_path / "host.json"
    described.write_text(
        json.dumps(
            {
                "driver": "550.54.15",
                "gpus": [
                    {"name": "A100", "uuid": "GPU-0", "xids": [79, 48, 79], "ecc_uncorrected": 2}
                ],
            }
        )
    )
    monkeypatch.setenv("GPUENV_HOST_FILE", str(described))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuCollector(GpuReadings(Application().engine)))
    text = generate_latest(registry).decode()
    assert "gpuenv_exporter_nvml_up 0.0" in text
    labels = 'gpu="0",project="",run="",user="",uuid="GPU-0"'
    assert f'gpuenv_gpu_xid_errors_total{{{labels},xid="79"}} 2.0' in text
    assert f'gpuenv_gpu_xid_errors_total{{{labels},xid="48"}} 1.0' in text
    ecc = 'gpu="0",project="",run="",type="uncorrected",user="",uuid="GPU-0"'  # sorted
    assert f"gpuenv_gpu_ecc_errors_total{{{ecc}}} 2.0" in text
    series = [line.rpartition(" ")[0] for line in text.splitlines() if not line.startswith("#")]
    assert len(series) == len(set(series)), "a series listed twice"
    types = [line.split()[2:] for line in text.splitlines() if line.startswith("# TYPE")]
    counted = [name for name, kind in types if kind == "counter"]
    assert counted, types
    for name in counted:  # each counter is NAME_total, and so are its samples
        assert name.endswith("_total") and f"\n{name}{{" in text, name


@pytest.mark.parametrize(
    ("listen", "hint"),
    [
        # TEST-NET-1 (RFC 5737): never one of this host's addresses
        ("192.0.2.1:9478", "that address is not one of this host's"),
        ("[2001:db8::1]:9478", "that address is not one of this host's"),
    ],
)
def test_an_address_this_host_does_not_have_gets_the_right_hint(listen: str, hint: str) -> None:
    result = CliRunner().invoke(main, ["exporter", "--listen", listen])
    assert result.exit_code == 20, result.output
    assert f"cannot listen on {listen}" in result.stderr
    assert hint in result.stderr and "0.0.0.0:9478" in result.stderr


@pytest.mark.parametrize(
    ("number", "said"),
    [
        (errno.EADDRNOTAVAIL, "not one of this host's"),
        (errno.EACCES, "ports below 1024 need root"),
        (errno.EADDRINUSE, "something listens there already"),
        (errno.EIO, "pick another address"),
    ],
)
def test_bind_hints_by_reason(number: int, said: str) -> None:
    from gpuenv.cli.listen import bind_hint

    assert said in bind_hint(OSError(number, os.strerror(number)), 9478, 9478)


def test_alert_rules_are_refused_for_names_they_are_not_written_on() -> None:
    """Issue 31: rules on gpuenv_gpu_* would never fire on an exporter serving only
    DCGM_FI_* names: refused with the fix; printed for gpuenv's names or both."""
    from click.testing import CliRunner

    from gpuenv.cli.tree import main

    refused = CliRunner().invoke(main, ["exporter", "--print-alert-rules", "--names", "dcgm"])
    assert refused.exit_code == 2 and "--names both" in refused.stderr
    for names in ("gpuenv", "both"):
        printed = CliRunner().invoke(main, ["exporter", "--print-alert-rules", "--names", names])
        assert printed.exit_code == 0 and "gpuenv_gpu_" in printed.stdout
