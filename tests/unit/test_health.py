"""Health findings from NVML's readings (gpuenv/monitoring/health.py), one case a line."""

from __future__ import annotations

from typing import Any

import pytest

from gpuenv.host.machine import Gpu
from gpuenv.monitoring.health import assess

BUSY = {"utilization": 95}
CASES: list[tuple[str, dict[str, Any], list[tuple[str, str, str]]]] = [
    # id, readings, [(kind, severity, line)]
    ("healthy", {"temperature_c": 60, "slowdown_temperature_c": 85, "clocks_event_reasons": 0}, []),
    ("idle is no problem", {"clocks_event_reasons": 0x1}, []),
    ("app clocks, sync boost, display: none", {"clocks_event_reasons": 0x2 | 0x10 | 0x100}, []),
    ("nothing known", {}, []),
    (
        "thermal slowdown",
        {"temperature_c": 87, "slowdown_temperature_c": 85, "clocks_event_reasons": 0x20},
        [
            (
                "thermal",
                "warn",
                "thermal slowdown on GPU 3 at 87 °C: check the airflow and fans (it slows down at 85 °C)",
            )
        ],
    ),
    (
        "hardware thermal",
        {"temperature_c": 90, "clocks_event_reasons": 0x40},
        [
            (
                "thermal",
                "warn",
                "hardware thermal slowdown on GPU 3 at 90 °C: check the airflow and fans",
            )
        ],
    ),
    (
        "hot past threshold, no bit yet",
        {"temperature_c": 86, "slowdown_temperature_c": 85},
        [
            (
                "thermal",
                "warn",
                "thermal slowdown on GPU 3 at 86 °C: check the airflow and fans (it slows down at 85 °C)",
            )
        ],
    ),
    (
        "near the threshold",
        {"temperature_c": 81, "slowdown_temperature_c": 85},
        [
            (
                "near_slowdown",
                "info",
                "GPU 3 at 81 °C, near its slowdown threshold of 85 °C: check the airflow and fans before it slows down",
            )
        ],
    ),
    ("just below near", {"temperature_c": 79, "slowdown_temperature_c": 85}, []),
    (
        "power cap",
        {"power_w": 398.4, "power_limit_w": 400, "clocks_event_reasons": 0x4},
        [
            (
                "power_cap",
                "info",
                "power cap on GPU 3 at 398/400 W: normal at full load; if the limit was lowered, raise it with `nvidia-smi -pl`",
            )
        ],
    ),
    (
        "hardware slowdown",
        {"clocks_event_reasons": 0x8},
        [
            (
                "hw_slowdown",
                "warn",
                "hardware slowdown on GPU 3 (clocks halved by the board): check the power cables and supply and the airflow (`nvidia-smi -q -d PERFORMANCE` shows which)",
            )
        ],
    ),
    (
        "power brake",
        {"clocks_event_reasons": 0x80},
        [
            (
                "power_brake",
                "warn",
                "power brake slowdown on GPU 3: the system's power supply asserted the brake: check the PSUs and the power cabling",
            )
        ],
    ),
    (
        "downtrained width",
        {"pcie_width": 8, "pcie_width_max": 16, "pcie_gen": 4, "pcie_gen_max": 4},
        [
            (
                "pcie_width",
                "warn",
                "PCIe link of GPU 3 runs at x8, the card and slot support x16: reseat the card and check the slot and riser",
            )
        ],
    ),
    ("lower gen when idle: power saving", {"pcie_gen": 1, "pcie_gen_max": 4, "utilization": 0}, []),
    (
        "lower gen under load",
        {**BUSY, "pcie_gen": 3, "pcie_gen_max": 4},
        [
            (
                "pcie_gen",
                "warn",
                "PCIe link of GPU 3 runs at gen 3 under load, the card and slot support gen 4: check the slot's PCIe setting in the BIOS, and reseat the card or riser",
            )
        ],
    ),
    (
        "uncorrected ECC",
        {"ecc_uncorrected": 2, "ecc_corrected": 10},
        [
            (
                "ecc",
                "fail",
                "2 uncorrected ECC errors on GPU 3 since the driver loaded: drain it and reset it (`nvidia-smi -r -i 3`); replace it if they recur",
            )
        ],
    ),
    ("corrected ECC only", {"ecc_corrected": 120, "ecc_uncorrected": 0}, []),
    (
        "XID 79",
        {"xids": (79,)},
        [
            (
                "xid",
                "fail",
                "GPU 3 fell off the bus (XID 79): drain the node and power-cycle it; replace the card or riser if it recurs",
            )
        ],
    ),
    (
        "XID 13: the program",
        {"xids": (13,)},
        [
            (
                "xid",
                "info",
                "XID 13 on GPU 3: graphics engine exception: usually the program, not the GPU: check the job that ran there",
            )
        ],
    ),
    (
        "unknown XID",
        {"xids": (155,)},
        [
            (
                "xid",
                "warn",
                "XID 155 on GPU 3: look it up in NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors)",
            )
        ],
    ),
    (
        "repeated XID once",
        {"xids": (94, 94)},
        [("xid", "warn", "XID 94 on GPU 3: contained ECC error: restart the program that ran")],
    ),
    (
        "lost",
        {"lost": "GPU is lost", "pci_bus_id": "00000000:3B:00.0"},
        [
            (
                "lost",
                "fail",
                "GPU 3 (00000000:3B:00.0) fell off the bus (NVML: GPU is lost): no run can use it: drain the node and reboot it (`nvidia-smi -r -i 3` rarely recovers it); replace the card or riser if it recurs",
            )
        ],
    ),
    (
        "lost hides the rest",
        {"lost": "GPU is lost", "ecc_uncorrected": 5},
        [
            (
                "lost",
                "fail",
                "GPU 3 fell off the bus (NVML: GPU is lost): no run can use it: drain the node and reboot it (`nvidia-smi -r -i 3` rarely recovers it); replace the card or riser if it recurs",
            )
        ],
    ),
]


@pytest.mark.parametrize(
    ("readings", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_findings(readings: dict[str, Any], expected: list[tuple[str, str, str]]) -> None:
    findings = assess(Gpu(3, "NVIDIA A100-SXM4-80GB", **readings))
    assert [(f.kind, f.severity, f.line) for f in findings] == expected


def test_worst_first() -> None:
    gpu = Gpu(0, "A100", clocks_event_reasons=0x4 | 0x20, temperature_c=88, ecc_uncorrected=1)
    assert [f.kind for f in assess(gpu)] == ["ecc", "thermal", "power_cap"]
