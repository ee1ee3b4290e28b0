"""gpuenv's NVML readings under dcgm-exporter's names, units and labels, so dashboards
and rules written for it (Grafana's dashboard 12239) work on GPUs DCGM cannot serve, such
as GeForce cards. Pure, like gpuenv.monitoring.metrics.

Names, types, help and units are dcgm-exporter's `etc/default-counters.csv` and the field
descriptions of NVIDIA/go-dcgm `pkg/dcgm/const_fields.go`; the labels are those its
`internal/pkg/rendermetrics/render_metrics.go` writes (tag 4.5.3-4.8.2), with gpuenv's
`project`, `user` and `run` added the way dcgm-exporter adds `pod` or `hpc_job`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from gpuenv.host.machine import Gpu, Host
from gpuenv.monitoring.metrics import Family, Holder

# render_metrics.go: gpu, UUID, pci_bus_id, device, modelName, then Hostname; the
# DCGM_FI_DRIVER_VERSION label is default-counters.csv's (a "label" field).
DCGM_LABELS = (
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "Hostname",
    "DCGM_FI_DRIVER_VERSION",
    "project",
    "user",
    "run",
)
XID_MESSAGES = Path(__file__).with_name("dcgm_xid_messages.json")
UNKNOWN_XID = "Unknown Error"  # gpu_collector.go's unknownErr


@dataclass(frozen=True)
class Field:
    """A DCGM field as a gauge: its name, dcgm-exporter's help, and the Gpu reading in
    DCGM's unit (None: the GPU does not report it, and there is no sample)."""

    name: str
    help: str
    value_of: Callable[[Gpu], float | None]


def _fb_free(gpu: Gpu) -> float | None:
    """NVML's free memory is its total less its used."""
    if gpu.memory_total_mib is None or gpu.memory_used_mib is None:
        return None
    return gpu.memory_total_mib - gpu.memory_used_mib


FIELDS = (
    Field("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", lambda g: g.sm_clock_mhz),
    Field(
        "DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", lambda g: g.memory_clock_mhz
    ),
    Field("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda g: g.temperature_c),
    Field("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda g: g.power_w),
    Field("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda g: g.utilization),
    Field("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", _fb_free),
    Field("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda g: g.memory_used_mib),
    Field(
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "Current clock event reasons (bitmask of DCGM_CLOCKS_EVENT_REASON_*).",
        lambda g: g.clocks_event_reasons,
    ),
)


@cache
def xid_messages() -> dict[int, str]:
    """dcgm-exporter's err_msg for each XID (its xidErrCodeToText, vendored as data)."""
    data = json.loads(XID_MESSAGES.read_text(encoding="utf-8"))
    return {int(code): text for code, text in data["err_msg"].items()}


def dcgm_families(
    host: Host, held: Mapping[str, Holder], last_xid: Mapping[int, int], hostname: str
) -> list[Family]:
    """The DCGM families with this scrape's samples; `last_xid` is GPU index -> the XID
    reported last. A lost GPU has no samples here (DCGM reads none from it either)."""
    fields = [Family(f.name, f.help, "gauge", DCGM_LABELS) for f in FIELDS]
    xid = Family(
        "DCGM_FI_DEV_XID_ERRORS",
        "Value of the last XID error encountered.",
        "gauge",
        (*DCGM_LABELS, "err_code", "err_msg"),
    )
    for gpu in host.gpus:
        if gpu.lost:
            continue
        by = held.get(gpu.key, Holder("", ""))
        labels = (
            str(gpu.index),
            gpu.uuid or "",
            gpu.pci_bus_id or "",
            f"nvidia{gpu.index}",
            gpu.name,
            hostname,
            str(host.driver or ""),
            by.project,
            by.user,
            by.run,
        )
        for family, field in zip(fields, FIELDS, strict=True):
            value = field.value_of(gpu)
            if value is not None:
                family.samples.append((labels, float(value)))
        if gpu.index in last_xid:
            code = last_xid[gpu.index]
            message = xid_messages().get(code, UNKNOWN_XID)
            xid.samples.append(((*labels, str(code), message), float(code)))
    return [*fields, xid]
