"""Is each GPU healthy and running at full speed? Findings from NVML's readings, each
with a one-line remedy, for `top`, `ps`, `doctor` and the exporter. Pure: fed a Gpu.

Sources: the clock event reason bits and what each means are NVML's
(nvml.h, nvmlClocksEventReason*; NVML API reference "Clocks Event Reasons"); the XID
meanings and actions follow NVIDIA's Xid catalog
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html).

>>> from gpuenv.host.detect import Gpu
>>> [f.line for f in assess(Gpu(3, "A100", temperature_c=87, slowdown_temperature_c=85,
...                                 clocks_event_reasons=0x20))]
['thermal slowdown on GPU 3 at 87 °C: check the airflow and fans (it slows down at 85 °C)']
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gpuenv.host.machine import Gpu

SEVERITIES = ("info", "warn", "fail")
NEAR_SLOWDOWN_C = 5  # within this many degrees of the slowdown threshold: say so
BUSY_UTILIZATION = 10  # percent; below it a lower PCIe generation is power saving

# NVML's clock event reasons that slow a GPU down. Idle, application clocks, sync boost
# and display clock settings are not problems, so they are not listed.
THERMAL_SW, THERMAL_HW = 0x20, 0x40
CLOCK_EVENTS: tuple[tuple[int, str, str, str, str], ...] = (
    # bit, kind, severity, what, remedy
    (
        0x4,
        "power_cap",
        "info",
        "power cap on GPU {index}{power}",
        "normal at full load; if the limit was lowered, raise it with `nvidia-smi -pl`",
    ),
    (
        0x8,
        "hw_slowdown",
        "warn",
        "hardware slowdown on GPU {index} (clocks halved by the board)",
        "check the power cables and supply and the airflow "
        "(`nvidia-smi -q -d PERFORMANCE` shows which)",
    ),
    (
        0x80,
        "power_brake",
        "warn",
        "power brake slowdown on GPU {index}",
        "the system's power supply asserted the brake: check the PSUs and the power cabling",
    ),
)

# XID: (severity, what, remedy); others get a pointer to NVIDIA's catalog.
PROGRAM_FAULT = "usually the program, not the GPU: check the job that ran there"
RESET = "drain it and reset it (`nvidia-smi -r -i {index}`)"
REPLACE = f"{RESET}; replace it if it recurs"
XIDS: dict[int, tuple[str, str, str]] = {
    13: ("info", "XID 13 on GPU {index}: graphics engine exception", PROGRAM_FAULT),
    31: ("info", "XID 31 on GPU {index}: GPU memory page fault", PROGRAM_FAULT),
    43: ("info", "XID 43 on GPU {index}: GPU stopped processing", PROGRAM_FAULT),
    48: ("fail", "XID 48 on GPU {index}: double-bit ECC error", REPLACE),
    63: ("info", "XID 63 on GPU {index}: a memory row was remapped", "reset it when idle"),
    64: ("fail", "XID 64 on GPU {index}: a row remap failed", REPLACE),
    74: ("fail", "XID 74 on GPU {index}: NVLink error", f"{RESET}; check the NVLink bridges"),
    79: (
        "fail",
        "GPU {index} fell off the bus (XID 79)",
        "drain the node and power-cycle it; replace the card or riser if it recurs",
    ),
    92: ("warn", "XID 92 on GPU {index}: high corrected-ECC rate", "plan to replace it"),
    94: ("warn", "XID 94 on GPU {index}: contained ECC error", "restart the program that ran"),
    95: ("fail", "XID 95 on GPU {index}: uncontained ECC error", RESET),
    119: ("fail", "XID 119 on GPU {index}: GSP firmware timeout", f"{RESET}; update the driver"),
    120: ("fail", "XID 120 on GPU {index}: GSP firmware error", f"{RESET}; update the driver"),
}


@dataclass(frozen=True)
class Finding:
    gpu: int
    kind: str  # lost | thermal | near_slowdown | power_cap | hw_slowdown | power_brake |
    # pcie_width | pcie_gen | ecc | xid
    severity: str  # info | warn | fail
    message: str
    remedy: str

    @property
    def line(self) -> str:
        return f"{self.message}: {self.remedy}"

    def to_data(self) -> dict[str, Any]:
        return asdict(self)


def assess(gpu: Gpu) -> list[Finding]:
    """Every problem NVML's readings show on this GPU, worst first."""
    if gpu.lost:
        bus = f" ({gpu.pci_bus_id})" if gpu.pci_bus_id else ""
        return [
            Finding(
                gpu.index,
                "lost",
                "fail",
                f"GPU {gpu.index}{bus} fell off the bus (NVML: {gpu.lost})",
                "no run can use it: drain the node and reboot it "
                f"(`nvidia-smi -r -i {gpu.index}` rarely recovers it); "
                "replace the card or riser if it recurs",
            )
        ]
    findings = [*_temperature(gpu), *_clock_events(gpu), *_pcie(gpu), *_ecc(gpu)]
    findings += [_xid(gpu.index, xid) for xid in dict.fromkeys(gpu.xids)]
    return sorted(findings, key=lambda f: -SEVERITIES.index(f.severity))


def assess_all(gpus: Sequence[Gpu]) -> list[Finding]:
    return [finding for gpu in gpus for finding in assess(gpu)]


def _temperature(gpu: Gpu) -> list[Finding]:
    reasons = gpu.clocks_event_reasons or 0
    temperature, slowdown = gpu.temperature_c, gpu.slowdown_temperature_c
    at = f" at {temperature} °C" if temperature is not None else ""
    limit = f" (it slows down at {slowdown} °C)" if slowdown is not None else ""
    hot = temperature is not None and slowdown is not None and temperature >= slowdown
    if reasons & (THERMAL_SW | THERMAL_HW) or hot:
        kind = "hardware thermal slowdown" if reasons & THERMAL_HW else "thermal slowdown"
        return [
            Finding(
                gpu.index,
                "thermal",
                "warn",
                f"{kind} on GPU {gpu.index}{at}",
                f"check the airflow and fans{limit}",
            )
        ]
    if (
        temperature is not None
        and slowdown is not None
        and temperature >= slowdown - NEAR_SLOWDOWN_C
    ):
        return [
            Finding(
                gpu.index,
                "near_slowdown",
                "info",
                f"GPU {gpu.index} at {temperature} °C, "
                f"near its slowdown threshold of {slowdown} °C",
                "check the airflow and fans before it slows down",
            )
        ]
    return []


def _clock_events(gpu: Gpu) -> list[Finding]:
    reasons = gpu.clocks_event_reasons or 0
    power = ""
    if gpu.power_w is not None and gpu.power_limit_w:
        power = f" at {gpu.power_w:.0f}/{gpu.power_limit_w:.0f} W"
    return [
        Finding(gpu.index, kind, severity, what.format(index=gpu.index, power=power), remedy)
        for bit, kind, severity, what, remedy in CLOCK_EVENTS
        if reasons & bit
    ]


def _pcie(gpu: Gpu) -> list[Finding]:
    findings = []
    if gpu.pcie_width is not None and gpu.pcie_width_max and gpu.pcie_width < gpu.pcie_width_max:
        findings.append(
            Finding(
                gpu.index,
                "pcie_width",
                "warn",
                f"PCIe link of GPU {gpu.index} runs at x{gpu.pcie_width}, "
                f"the card and slot support x{gpu.pcie_width_max}",
                "reseat the card and check the slot and riser",
            )
        )
    # An idle GPU drops its link generation to save power: only a busy one counts.
    busy = (gpu.utilization or 0) >= BUSY_UTILIZATION
    if busy and gpu.pcie_gen is not None and gpu.pcie_gen_max and gpu.pcie_gen < gpu.pcie_gen_max:
        findings.append(
            Finding(
                gpu.index,
                "pcie_gen",
                "warn",
                f"PCIe link of GPU {gpu.index} runs at gen {gpu.pcie_gen} under load, "
                f"the card and slot support gen {gpu.pcie_gen_max}",
                "check the slot's PCIe setting in the BIOS, and reseat the card or riser",
            )
        )
    return findings


def _ecc(gpu: Gpu) -> list[Finding]:
    if not gpu.ecc_uncorrected:
        return []
    noun = "error" if gpu.ecc_uncorrected == 1 else "errors"
    return [
        Finding(
            gpu.index,
            "ecc",
            "fail",
            f"{gpu.ecc_uncorrected} uncorrected ECC {noun} on GPU {gpu.index} "
            "since the driver loaded",
            f"drain it and reset it (`nvidia-smi -r -i {gpu.index}`); replace it if they recur",
        )
    ]


def recorded_xid(index: int, xid: int, at: float) -> Finding:
    """An XID a sampler recorded earlier: what it meant and what to do, with when; at
    most a warning, since the GPU may have been reset since."""
    finding = _xid(index, xid)
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(at))
    severity = "warn" if finding.severity == "fail" else finding.severity
    return Finding(index, "xid", severity, f"{finding.message}, recorded at {when}", finding.remedy)


def _xid(index: int, xid: int) -> Finding:
    severity, what, remedy = XIDS.get(
        xid,
        (
            "warn",
            f"XID {xid} on GPU {{index}}",
            "look it up in NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors)",
        ),
    )
    return Finding(index, "xid", severity, what.format(index=index), remedy.format(index=index))
