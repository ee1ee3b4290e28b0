"""host.py's NVML detection and the monitor, through the real nvidia-ml-py on the
scripted libnvidia-ml.so.1 (tests/nvml/): the twins of the GPUENV_HOST_FILE tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from gpuenv.host.detect import detect_host
from gpuenv.host.nvml import NvmlListener, detect_nvml
from gpuenv.host.procfs import process_start
from gpuenv.monitoring.monitor import gpu_rows, runs_from
from gpuenv.reservations.claims import Claim
from gpuenv.reservations.gpus import choose, parse_gpus_option
from tests.scripted_nvml import A100, REPO, ScriptedNvml, gpu, scenario
from tests.unit.test_monitor import CONTAINER, containers


def test_detect_host_reads_every_gpu_through_nvml(nvml: ScriptedNvml) -> None:
    nvml.write(
        scenario(
            gpu(0, utilization=97, memory_used_mib=30000, temperature_c=71, power_mw=312500),
            gpu(1, processes=[{"pid": 4242, "used_memory_mib": 1024}]),
            driver="535.104.05",
            cuda=12020,
        )
    )
    host = detect_host()
    assert (host.source, str(host.driver), host.cuda_driver) == ("nvml", "535.104.05", "12.2")
    assert host.describe() == "driver 535.104.05, 2× NVIDIA A100-SXM4-80GB (detected through NVML)"
    first, second = host.gpus
    assert (first.index, first.name, first.uuid, str(first.compute_capability)) == (
        0,
        A100,
        "GPU-00000000-1111-2222-3333-444444444444",
        "8.0",
    )
    assert (first.brand, first.memory_total_mib, first.memory_used_mib) == ("tesla", 81920, 30000)
    assert (first.utilization, first.temperature_c, first.power_w, first.power_limit_w) == (
        97,
        71,
        312.5,
        400.0,
    )
    assert first.slowdown_temperature_c == 85
    assert (first.sm_clock_mhz, first.sm_clock_max_mhz, first.memory_clock_mhz) == (210, 1410, 1593)
    assert (first.pcie_gen, first.pcie_gen_max, first.pcie_width, first.pcie_width_max) == (
        4,
        4,
        16,
        16,
    )
    assert (first.ecc_corrected, first.ecc_uncorrected, first.clocks_event_reasons) == (0, 0, 1)
    assert first.pci_bus_id == "00000000:17:00.0" and first.mig_mode is False
    assert [(p.pid, p.used_memory_mib) for p in second.processes] == [(4242, 1024)]
    assert host.platform in ("linux/amd64", "linux/arm64")
    # Every nvmlInit has its nvmlShutdown.
    calls = nvml.calls()
    assert calls.count("nvmlInitWithFlags") == calls.count("nvmlShutdown") == 1


@pytest.mark.parametrize(
    ("error", "note"),
    [
        ("DRIVER_NOT_LOADED", "NVML: Driver Not Loaded"),
        ("LIBRARY_NOT_FOUND", "NVML: NVML Shared Library Not Found"),
        ("LIB_RM_VERSION_MISMATCH", "NVML: RM has detected an NVML/RM version mismatch."),
    ],
)
def test_nvml_that_cannot_start_is_a_host_without_gpus(
    nvml: ScriptedNvml, monkeypatch: pytest.MonkeyPatch, error: str, note: str
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # and no nvidia-smi to fall back to
    nvml.write({"init_error": error})
    host = detect_host()
    assert (host.driver, host.gpus, host.source) == (None, (), "none")
    assert host.note == f"{note}; nvidia-smi is not on PATH"


@pytest.mark.parametrize("lost", [True, "handle"])
def test_a_lost_gpu_is_listed_and_hides_no_other(nvml: ScriptedNvml, lost: object) -> None:
    nvml.write(scenario(gpu(0), gpu(1, lost=lost), gpu(2)))
    host = detect_nvml()
    assert not isinstance(host, str)
    assert [(g.index, g.lost) for g in host.gpus] == [(0, None), (1, "GPU is lost"), (2, None)]
    assert host.gpus[2].uuid == "GPU-00000002-1111-2222-3333-444444444444"
    # A reservation never picks it, and naming it says why not.
    _, keys = choose(parse_gpus_option("2"), host, [])
    assert keys == [host.gpus[0].key, host.gpus[2].key]
    with pytest.raises(Exception, match="GPU 1: fell off the bus"):
        choose(parse_gpus_option("device=1"), host, [])


def test_a_gpu_lost_while_reading_is_marked_lost(nvml: ScriptedNvml) -> None:
    nvml.write(scenario(gpu(0, fail={"nvmlDeviceGetTemperature": "GPU_IS_LOST"})))
    host = detect_nvml()
    assert not isinstance(host, str) and host.gpus[0].lost == "GPU is lost"


def test_unsupported_readings_stay_unknown(nvml: ScriptedNvml) -> None:
    geforce = gpu(0, name="NVIDIA GeForce RTX 4090", brand=15, compute_capability="8.9")
    for key in ("ecc", "pcie", "slowdown_c", "clocks_event_reasons", "graphics_processes"):
        del geforce[key]
    geforce["fail"] = {
        "nvmlDeviceGetPowerUsage": "NOT_SUPPORTED",
        "nvmlDeviceGetMigMode": "NOT_SUPPORTED",
    }
    nvml.write(scenario(geforce))
    host = detect_nvml()
    assert not isinstance(host, str)
    (card,) = host.gpus
    assert (card.name, card.brand, str(card.compute_capability)) == (
        "NVIDIA GeForce RTX 4090",
        "geforce_rtx",
        "8.9",
    )
    assert card.ecc_uncorrected is card.pcie_gen is card.power_w is card.mig_mode is None
    assert card.temperature_c == 34


def test_mig_instances_by_mig_index(nvml: ScriptedNvml) -> None:
    mig = [
        {"uuid": "MIG-aaaa", "gpu_instance": 1, "compute_instance": 0, "memory_total_mib": 9984},
        {"uuid": "MIG-bbbb", "gpu_instance": 2, "compute_instance": 0, "memory_total_mib": 19968},
    ]
    nvml.write(scenario(gpu(0, mig_mode=1, max_mig_devices=7, mig=mig), gpu(1)))
    host = detect_nvml()
    assert not isinstance(host, str)
    assert host.gpus[0].mig_mode is True and host.gpus[1].mig_devices == ()
    assert [(m.uuid, m.gpu_instance, m.memory_total_mib) for m in host.gpus[0].mig_devices] == [
        ("MIG-aaaa", 1, 9984),
        ("MIG-bbbb", 2, 19968),
    ]
    import pynvml

    pynvml.nvmlInit()
    try:
        parent = pynvml.nvmlDeviceGetHandleByIndex(0)
        child = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 1)
        back = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(child)
        assert pynvml.nvmlDeviceGetUUID(back) == host.gpus[0].uuid
        assert pynvml.nvmlDeviceIsMigDeviceHandle(child)
        assert pynvml.nvmlDeviceGetMigMode(parent) == [1, 1]
        with pytest.raises(pynvml.NVMLError_NotFound):
            pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 2)
    finally:
        pynvml.nvmlShutdown()


def test_the_monitor_maps_nvml_processes_to_runs(
    nvml: ScriptedNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The twin of test_monitor's host-described rows: the same attribution from NVML."""
    monkeypatch.setattr(
        "gpuenv.monitoring.monitor.container_of", lambda pid: CONTAINER if pid == 4242 else None
    )
    monkeypatch.setattr("gpuenv.monitoring.monitor.process_owner", lambda pid: "bob")
    nvml.write(
        scenario(
            gpu(0, processes=[{"pid": 777, "used_memory_mib": 900}]),
            gpu(
                1, uuid="GPU-1", utilization=97, processes=[{"pid": 4242, "used_memory_mib": 30000}]
            ),
        )
    )
    host = detect_host()
    me = os.getpid()
    claim = Claim(
        "GPU-1", "alice", 1000, me, process_start(me), os.uname().nodename, "demo", time.time()
    )
    rows = gpu_rows(host, [claim], runs_from(containers()))
    assert rows[0].users == [
        {"pid": 777, "memory_mib": 900, "gpuenv": False, "container": None, "user": "bob"}
    ]
    assert rows[1].claimed_by == {"user": "alice", "project": "demo", "pid": me}
    assert rows[1].users[0]["run"] == "brave_turing" and rows[1].utilization == 97
    assert rows[0].health == rows[1].health == []


def test_the_listener_counts_xids_as_nvml_reports_them(nvml: ScriptedNvml) -> None:
    nvml.write(scenario(gpu(0), gpu(1)))
    listener = NvmlListener()
    listener.start()
    try:
        listener.drain()
        assert listener.counts == {}
        nvml.write(scenario(gpu(0), gpu(1, xids=[79, 48, 79])))
        listener.drain()
        assert listener.counts == {(1, 79): 2, (1, 48): 1}
        host = detect_nvml(listener.xids)
        assert not isinstance(host, str) and host.gpus[1].xids == (48, 79)
    finally:
        listener.stop()
    calls = nvml.calls()
    assert calls.count("nvmlInitWithFlags") == calls.count("nvmlShutdown") == 2


def test_the_library_is_found_through_the_search_path(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """As on a GPU server: pynvml dlopens libnvidia-ml.so.1 by name; without our folder on
    LD_LIBRARY_PATH there is none on this machine, with it there is ours."""
    scripted = ScriptedNvml(tmp_path)
    scripted.write(scenario(gpu(0)))
    code = "from gpuenv.host.nvml import detect_nvml; h = detect_nvml(); print(h if isinstance(h, str) else h.describe())"
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    found = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, **scripted.env},
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    assert found.stdout.strip() == f"driver 550.54.15, {A100} (detected through NVML)"
    if not os.path.exists("/dev/nvidiactl"):  # a machine without NVIDIA's own library
        missing = subprocess.run(
            [sys.executable, "-c", code],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
        )
        assert missing.stdout.strip() == "NVML: NVML Shared Library Not Found"


def test_a_broken_script_says_so(nvml: ScriptedNvml) -> None:
    nvml.path.write_text("{not json")
    assert detect_nvml() == "NVML: Not Supported"  # the library forgot the whole script
    nvml.write(json.loads('{"driver": "550.54.15", "gpus": []}'))
    host = detect_nvml()
    assert not isinstance(host, str) and host.gpus == ()


def test_without_a_script_the_driver_is_not_loaded(
    nvml: ScriptedNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUENV_TEST_NVML")
    assert detect_nvml() == "NVML: Driver Not Loaded"
