"""The scripted NVML (tests/nvml/) from the tests' side: build it once, write the JSON a
test scripts, and load it the way nvidia-ml-py does on a GPU server.

Subprocesses (the gpuenv CLI) get it through the library search path: LD_LIBRARY_PATH
names the folder with our libnvidia-ml.so.1, and pynvml's own `CDLL("libnvidia-ml.so.1")`
finds it. In-process tests load it by path first; the dynamic loader then answers
pynvml's load by that soname with it.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCRIPT_ENV = "GPUENV_TEST_NVML"
LOG_ENV = "GPUENV_TEST_NVML_LOG"
A100 = "NVIDIA A100-SXM4-80GB"


@functools.cache
def library_dir() -> Path:
    """Build (or reuse) the library; its folder, for LD_LIBRARY_PATH."""
    result = subprocess.run(
        [str(REPO / "tests" / "nvml" / "build.sh")], capture_output=True, text=True, check=False
    )
    if result.returncode:
        raise RuntimeError(f"building the scripted NVML failed:\n{result.stderr}")
    return Path(result.stdout.strip().splitlines()[-1])


def gpu(index: int, **readings: Any) -> dict[str, Any]:
    """A healthy, idle A100 as NVML reports one, with `readings` replacing defaults."""
    base: dict[str, Any] = {
        "name": A100,
        "uuid": f"GPU-{index:08x}-1111-2222-3333-444444444444",
        "compute_capability": "8.0",
        "brand": 2,  # NVML_BRAND_TESLA
        "pci_bus_id": f"00000000:{0x17 + index:02X}:00.0",
        "memory_total_mib": 81920,
        "memory_used_mib": 0,
        "utilization": 0,
        "temperature_c": 34,
        "slowdown_c": 85,
        "shutdown_c": 92,
        "power_mw": 61000,
        "power_limit_mw": 400000,
        "clocks_event_reasons": 1,  # GPU idle: never a problem
        "clocks_mhz": {"sm": 210, "memory": 1593},
        "max_clocks_mhz": {"sm": 1410, "memory": 1593},
        "pcie": {"gen": 4, "max_gen": 4, "width": 16, "max_width": 16},
        "ecc": {"corrected_volatile": 0, "uncorrected_volatile": 0},
        "processes": [],
        "graphics_processes": [],
        "mig_mode": 0,
    }
    base.update(readings)
    return base


# A100 80GB GPU-instance profiles as `nvidia-smi mig -lgip` lists them (NVIDIA MIG user
# guide, "A100 MIG Profiles"): name -> (profile id, GPU slices, memory in MB).
A100_PROFILES = {
    "1g.10gb": (19, 1, 9984),
    "2g.20gb": (14, 2, 19968),
    "3g.40gb": (9, 3, 40192),
    "7g.80gb": (0, 7, 81408),
}


def mig_uuid(gpu_index: int, mig_index: int) -> str:
    return f"MIG-{gpu_index:04x}{mig_index:04x}-aaaa-bbbb-cccc-dddddddddddd"


def mig(
    gpu_index: int,
    mig_index: int,
    profile: str = "1g.10gb",
    *,
    named: bool = True,
    attributes: bool = True,
    **readings: Any,
) -> dict[str, Any]:
    """A MIG device as NVML reports one: its GPU-instance profile (with its name unless
    not `named`: a driver that does not give it) and its attributes (slices, memory)."""
    profile_id, slices, memory_mb = A100_PROFILES[profile]
    data: dict[str, Any] = {
        "uuid": mig_uuid(gpu_index, mig_index),
        "gpu_instance": mig_index + 1,
        "compute_instance": 0,
        "memory_total_mib": memory_mb,
    }
    if named:
        data["profile"] = {
            "id": profile_id,
            "name": f"MIG {profile}",
            "slices": slices,
            "memory_mb": memory_mb,
        }
    if attributes:
        data["attributes"] = {"gi_slices": slices, "ci_slices": slices, "memory_mb": memory_mb}
    data.update(readings)
    return data


def mig_gpu(index: int, *profiles: str, **readings: Any) -> dict[str, Any]:
    """An A100 in MIG mode with instances of these profiles."""
    instances = [mig(index, n, p) for n, p in enumerate(profiles)]
    return gpu(index, mig_mode=1, max_mig_devices=7, mig=instances, **readings)


def scenario(*gpus: dict[str, Any], driver: str = "550.54.15", cuda: int = 12040) -> dict[str, Any]:
    return {"driver": driver, "cuda_driver": cuda, "gpus": list(gpus)}


class ScriptedNvml:
    """One test's NVML: `write` the scenario, hand `env` to subprocesses."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "nvml.json"
        self.log = folder / "nvml-calls.log"
        self.lib_dir = library_dir()

    def write(self, data: dict[str, Any]) -> None:
        temp = self.path.with_suffix(".tmp")
        temp.write_text(json.dumps(data))
        os.replace(temp, self.path)  # a new inode: the library rereads it

    @property
    def env(self) -> dict[str, str]:
        search = os.pathsep.join(
            p for p in (str(self.lib_dir), os.environ.get("LD_LIBRARY_PATH")) if p
        )
        return {"LD_LIBRARY_PATH": search, SCRIPT_ENV: str(self.path), LOG_ENV: str(self.log)}

    def calls(self) -> list[str]:
        return self.log.read_text().split() if self.log.exists() else []

    def load_in_process(self) -> None:
        """Make this process's pynvml use the scripted library (see the module doc)."""
        import pynvml

        ours = ctypes.CDLL(str(self.lib_dir / "libnvidia-ml.so.1"))
        if pynvml.nvmlLib is not None and getattr(pynvml.nvmlLib, "_handle", None) != ours._handle:
            pynvml.nvmlLib = None
            pynvml._nvmlGetFunctionPointer_cache.clear()
