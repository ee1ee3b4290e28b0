"""dcgm-exporter's names, units and labels for gpuenv's readings (gpuenv/monitoring/dcgm.py),
the idle metrics behind the idle alert, and the exporter's --names and
--print-alert-rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry, generate_latest

from gpuenv.cli.tree import main
from gpuenv.common.versions import DriverVersion
from gpuenv.host.machine import Gpu, Host
from gpuenv.monitoring.dcgm import DCGM_LABELS, dcgm_families, xid_messages
from gpuenv.monitoring.metrics import ALERT_RULES, Holder, idle_families

A100 = Gpu(
    0,
    "NVIDIA A100-SXM4-80GB",
    uuid="GPU-0",
    utilization=97,
    memory_total_mib=81920,
    memory_used_mib=61230,
    temperature_c=88,
    power_w=301.5,
    sm_clock_mhz=1410,
    memory_clock_mhz=1593,
    clocks_event_reasons=0x20 | 0x4,
    pci_bus_id="00000000:17:00.0",
)
HOST = Host(
    DriverVersion.parse("550.54.15"), (A100, Gpu(1, "unknown (lost)", lost="GPU is lost")), "nvml"
)
HELD = {"GPU-0": Holder("demo", "alice", "brave_turing")}


def by_name(
    last_xid: dict[int, int] | None = None,
) -> dict[str, list[tuple[tuple[str, ...], float]]]:
    families = dcgm_families(HOST, HELD, last_xid or {}, "gpu-01")
    return {family.name: family.samples for family in families}


# The value in DCGM's unit (default-counters.csv: MHz, C, W, %, MiB; the reasons a bitmask).
@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DCGM_FI_DEV_SM_CLOCK", 1410),
        ("DCGM_FI_DEV_MEM_CLOCK", 1593),
        ("DCGM_FI_DEV_GPU_TEMP", 88),
        ("DCGM_FI_DEV_POWER_USAGE", 301.5),
        ("DCGM_FI_DEV_GPU_UTIL", 97),
        ("DCGM_FI_DEV_FB_USED", 61230),
        ("DCGM_FI_DEV_FB_FREE", 81920 - 61230),
        ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 0x24),
    ],
)
def test_dcgm_names_carry_dcgm_units(name: str, value: float) -> None:
    assert [v for _, v in by_name()[name]] == [value]


def test_dcgm_labels_are_dcgm_exporters_and_gpuenvs_and_a_lost_gpu_has_none() -> None:
    assert DCGM_LABELS[:6] == ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")
    ((labels, _),) = by_name()["DCGM_FI_DEV_GPU_UTIL"]
    assert dict(zip(DCGM_LABELS, labels, strict=True)) == {
        "gpu": "0",
        "UUID": "GPU-0",
        "pci_bus_id": "00000000:17:00.0",
        "device": "nvidia0",
        "modelName": "NVIDIA A100-SXM4-80GB",
        "Hostname": "gpu-01",
        "DCGM_FI_DRIVER_VERSION": "550.54.15",
        "project": "demo",
        "user": "alice",
        "run": "brave_turing",
    }


@pytest.mark.parametrize(
    ("last", "err_msg"),
    [(79, "GPU has fallen off the bus"), (48, "Double Bit ECC Error"), (999, "Unknown Error")],
)
def test_the_last_xid_is_the_value_with_dcgm_exporters_message(last: int, err_msg: str) -> None:
    ((labels, value),) = by_name({0: last})["DCGM_FI_DEV_XID_ERRORS"]
    assert value == last and labels[-2:] == (str(last), err_msg)


def test_no_xid_no_sample() -> None:
    assert by_name()["DCGM_FI_DEV_XID_ERRORS"] == []


def test_the_vendored_xid_messages_are_whole() -> None:
    messages = xid_messages()
    assert sorted(messages) == list(range(173)) and messages[0] == "No Error"


def test_idle_seconds_only_for_held_gpus_and_the_policy_only_with_one() -> None:
    host = Host(DriverVersion.parse("550.54.15"), (A100, Gpu(1, "A100", uuid="GPU-1")), "nvml")
    idle, policy = idle_families(host, HELD, {"GPU-0": 4000.0, "GPU-1": 9000.0}, 3600.0)
    assert idle.samples == [(("0", "GPU-0", "demo", "alice", "brave_turing"), 4000.0)]
    assert policy.samples == [((), 3600.0)]
    assert idle_families(host, HELD, {}, None)[1].samples == []


def _registry(names: str) -> CollectorRegistry:
    from gpuenv.app.exporter import GpuReadings
    from gpuenv.cli.context import Application
    from gpuenv.cli.exporter import GpuCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuCollector(GpuReadings(Application().engine, names)))
    return registry


def _scrape(names: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A scrape of a described RTX 4090 (a host file), no engine, no idle policy."""
    described = tmp_path / "host.json"
    described.write_text(
        json.dumps(
            {
                "driver": "550.54.15",
                "gpus": [{"name": "RTX 4090", "uuid": "GPU-9", "xids": [13, 79]}],
            }
        )
    )
    monkeypatch.setenv("GPUENV_HOST_FILE", str(described))
    monkeypatch.setenv("GPUENV_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("GPUENV_SYSTEM_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent.sock")
    return generate_latest(_registry(names)).decode()


@pytest.mark.parametrize(
    ("names", "gpuenv", "dcgm"),
    [("gpuenv", True, False), ("dcgm", False, True), ("both", True, True)],
)
def test_names_choose_the_families(
    names: str, gpuenv: bool, dcgm: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = _scrape(names, tmp_path, monkeypatch)
    assert ("\ngpuenv_gpu_info{" in text) is gpuenv
    assert ("\nDCGM_FI_DEV_XID_ERRORS{" in text) is dcgm
    assert "gpuenv_exporter_nvml_up 0.0" in text  # always: the exporter's own health
    if dcgm:  # a host file's XIDs: the last one listed is the value
        assert 'err_code="79",err_msg="GPU has fallen off the bus"' in text
        assert 'modelName="RTX 4090"' in text and "} 79.0" in text


def test_print_alert_rules_prints_the_shipped_file() -> None:
    result = CliRunner().invoke(main, ["exporter", "--print-alert-rules"])
    assert result.exit_code == 0 and result.stdout == ALERT_RULES.read_text(encoding="utf-8")
    helptext = CliRunner().invoke(main, ["exporter", "--help"]).stdout
    assert "--names [gpuenv|dcgm|both]" in helptext and "12239" in helptext


def test_the_exporter_serves_a_claims_idle_time_and_the_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import time

    from gpuenv.monitoring.idle import record_name, update
    from gpuenv.reservations.claims import ClaimStore

    policy = tmp_path / "config.toml"
    policy.write_text('[idle]\nwarn_after = "1h"\n')
    policy.chmod(0o644)
    text = _scrape("gpuenv", tmp_path, monkeypatch)  # sets the state folder: no claims yet
    assert "\ngpuenv_gpu_claim_idle_seconds{" not in text
    monkeypatch.setenv("GPUENV_SYSTEM_CONFIG", str(policy))
    store = ClaimStore()
    try:
        with store.locked():
            store.add(["GPU-9"], "demo")  # held by this process
        now = time.time()
        state: dict[str, object] = {}
        update(state, {"GPU-9": 0}, now - 300, 5)
        update(state, {"GPU-9": 1}, now - 60, 5)
        store.write_record(record_name(os.getuid()), state)
        text = generate_latest(_registry("gpuenv")).decode()
    finally:
        store.close()
    (line,) = [x for x in text.splitlines() if x.startswith("gpuenv_gpu_claim_idle_seconds{")]
    assert 'project="demo"' in line and 'uuid="GPU-9"' in line
    assert 300 <= float(line.rpartition(" ")[2]) < 400  # idle since the first sample
    assert "\ngpuenv_idle_policy_warn_after_seconds 3600.0" in text
