"""What this machine has: the NVIDIA driver and every GPU, read through NVML.

NVML (nvidia-ml-py) is the source; `nvidia-smi --query-gpu` is the fallback where the
Python bindings cannot load the library; a machine with neither is a valid host with no
GPUs. GPUENV_HOST_FILE names a described host instead (`hostfile`).
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import replace

from gpuenv.common.platforms import this_platform
from gpuenv.common.versions import DriverVersion, recorded_capability
from gpuenv.host.hostfile import HOST_FILE_ENV, load_host_file
from gpuenv.host.machine import Gpu, Host
from gpuenv.host.nvml import detect_nvml

NVIDIA_SMI_FIELDS = ("index", "uuid", "name", "compute_cap", "memory.total", "driver_version")


def parse_nvidia_smi(output: str, fields: Sequence[str] = NVIDIA_SMI_FIELDS) -> Host:
    """Parse `nvidia-smi --query-gpu=... --format=csv,noheader,nounits` output."""
    gpus = []
    driver = None
    for row in csv.reader(io.StringIO(output), skipinitialspace=True):
        if not row:
            continue
        values = dict(zip(fields, (cell.strip() for cell in row), strict=False))
        driver = values.get("driver_version") or driver
        cc = values.get("compute_cap")
        memory = values.get("memory.total", "")
        gpus.append(
            Gpu(
                index=int(values["index"]),
                name=values["name"],
                uuid=values.get("uuid") or None,
                compute_capability=recorded_capability(cc),  # unreadable ([N/A]): unknown
                memory_total_mib=int(float(memory)) if memory.replace(".", "").isdigit() else None,
            )
        )
    return Host(DriverVersion.parse(driver) if driver else None, tuple(gpus), "nvidia-smi")


def detect_nvidia_smi() -> Host | str:
    """The host through nvidia-smi; older versions lack compute_cap, so retry without it."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "nvidia-smi is not on PATH"
    for fields in (NVIDIA_SMI_FIELDS, tuple(f for f in NVIDIA_SMI_FIELDS if f != "compute_cap")):
        try:
            result = subprocess.run(
                [exe, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=20,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"nvidia-smi failed: {exc}"
        if result.returncode == 0:
            try:
                return parse_nvidia_smi(result.stdout, fields)
            except (KeyError, ValueError) as exc:
                return f"nvidia-smi printed something unexpected ({exc})"
    return f"nvidia-smi failed: {(result.stderr or result.stdout).strip()[:200]}"


def detect_host() -> Host:
    """This machine, or the one described by GPUENV_HOST_FILE. Never raises for "no GPU"."""
    described = os.environ.get(HOST_FILE_ENV)
    if described:
        return load_host_file(described)
    reasons = []
    for detect in (detect_nvml, detect_nvidia_smi):
        found = detect()
        if isinstance(found, Host):
            return replace(found, platform=this_platform())
        reasons.append(found)
    return Host(None, (), "none", note="; ".join(reasons), platform=this_platform())
