"""The `gpus` grammar, as gpuenv.yaml writes it and `--gpus` takes it: all | none |
optional | a count | GPU indices or GPU/MIG UUIDs | {mig: PROFILE, count: N}, each
problem added to the document's checker at `gpus`."""

from __future__ import annotations

import re
from typing import Any

from gpuenv.common.checker import Checker, describe
from gpuenv.common.yamlfile import Path as YamlPath
from gpuenv.project.spec import GPU_KEYWORDS, GpuRequest, is_mig_profile

_GPU_UUID = r"^(GPU|MIG)-[A-Za-z0-9-]+$"


def _mig_request(check: Checker, value: dict[Any, Any]) -> GpuRequest | None:
    """`gpus: {mig: 1g.10gb, count: 2}`: MIG instances of one profile (count 1 if left out)."""
    path: YamlPath = ("gpus",)
    unknown = sorted(str(k) for k in value if k not in ("mig", "count"))
    for key in unknown:
        check.add((*path, key), f"unknown key {key!r} (known: mig, count)")
    profile, count = value.get("mig"), value.get("count", 1)
    ok = not unknown
    if not isinstance(profile, str) or not is_mig_profile(profile):
        what = (
            "the MIG profile is missing"
            if "mig" not in value
            else (f"{describe(profile)} is not a MIG profile")
        )
        check.add(
            (*path, "mig") if "mig" in value else path,
            f"{what}: write e.g. 1g.10gb, 3g.40gb or 1c.2g.20gb "
            "(`gpuenv doctor` lists this host's)",
        )
        ok = False
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_GPUS:
        check.add((*path, "count"), f"{describe(count)} is not a count of at least 1")
        ok = False
    return GpuRequest("mig", count=count, profile=profile) if ok else None


MAX_GPUS = 4096  # far more than one host has: a larger number is a typo


def parse_gpus_value(check: Checker, value: Any) -> GpuRequest | None:
    """The spec's `gpus`: all | none | optional | a count | indices or GPU/MIG UUIDs |
    {mig: PROFILE, count: N}."""
    if isinstance(value, dict):
        return _mig_request(check, value)
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            check.add(
                ("gpus",),
                "a GPU count must be at least 1 (use 'none' for no GPU, or [0] for the GPU "
                "with index 0)",
            )
            return None
        if value > MAX_GPUS:
            check.add(
                ("gpus",),
                f"{value} GPUs: a count is at most {MAX_GPUS} (no host has more); "
                "use 'all' for every GPU of the host",
            )
            return None
        return GpuRequest("count", count=value)
    if isinstance(value, str):
        if value in GPU_KEYWORDS:
            return GpuRequest(value)
        if value.isdigit():
            return parse_gpus_value(check, int(value))
        return _gpu_devices(check, [part.strip() for part in value.split(",")], listed=False)
    if isinstance(value, list):
        return _gpu_devices(check, value, listed=True)
    check.add(
        ("gpus",),
        f"expected all, none, optional, a count or a list of GPUs, got {describe(value)}",
    )
    return None


def _gpu_devices(check: Checker, items: list[Any], *, listed: bool) -> GpuRequest | None:
    """GPUs by index or UUID, each once: a YAML list (`listed`) or a comma-separated string."""
    path: YamlPath = ("gpus",)
    devices: list[str] = []
    problems_before = len(check.problems)
    for index, item in enumerate(items):
        item_path = (*path, index) if listed else path
        device = _gpu_device(item)
        if device is None:
            check.add(
                item_path,
                f"{describe(item)} is not a GPU index (0 to {MAX_GPUS - 1}) or UUID (GPU-... or "
                "MIG-...); "
                "use all, none, optional, a count or {mig: PROFILE, count: N} for the whole field",
            )
        elif device in devices:
            check.add(item_path, f"GPU {device} is listed twice")
        else:
            devices.append(device)
    if not devices and len(check.problems) == problems_before:
        check.add(path, "the list of GPUs is empty; use 'none' for no GPU")
    return GpuRequest("devices", devices=tuple(devices)) if devices else None


def _gpu_device(item: Any) -> str | None:
    """A GPU index (a number, or digits) or a GPU or MIG UUID, as text; else None."""
    if isinstance(item, int) and not isinstance(item, bool) and 0 <= item < MAX_GPUS:
        return str(item)
    if isinstance(item, str) and item.isdigit() and int(item) < MAX_GPUS:
        return str(int(item))
    if isinstance(item, str) and re.match(_GPU_UUID, item):
        return item
    return None
