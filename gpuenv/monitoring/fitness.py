"""Which GPUs are not to be handed out: failing ones and the ones the admin drained.

A GPU with uncorrected ECC errors, an XID that calls for a reset (NVML's event now, or
one a sampler recorded in the last hour), or a hardware slowdown (the board halves its
clocks: bad power, a hardware thermal event, the power brake) is *unhealthy*: a count
request (`--gpus 2`) and the wait queue never get it while the host has enough healthy
GPUs, and `top`, `ps`, the dashboard and `--json` show it as unhealthy, never free.
Asking for it by index or UUID still works, with a warning. An admin drains a GPU by
hand in the host config:

```toml
# /etc/gpuenv/config.toml
[gpus]
drain = [1, "GPU-3f0e…"]   # indices or UUIDs; a count request never gets them
```
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from gpuenv.common.siteconfig import SiteConfig, read_site_config
from gpuenv.errors import UsageError
from gpuenv.host.machine import Gpu, Host
from gpuenv.monitoring.health import XIDS
from gpuenv.monitoring.history import recorded_xids

# NVML's clock event reasons set by the board, not by load: HW slowdown (0x8), HW thermal
# slowdown (0x40), HW power brake (0x80) (nvml.h, nvmlClocksEventReason*).
HARDWARE_SLOWDOWN = 0x8 | 0x40 | 0x80
RECENT_FAULT = 3600.0  # an XID recorded this recently still marks the GPU


def fault(gpu: Gpu, recorded: Sequence[int] = ()) -> str | None:
    """Why NVML's readings (and the XIDs a sampler recorded, `recorded`) say this GPU
    must not be handed out; None when they do not.

    >>> fault(Gpu(1, "A100", ecc_uncorrected=2))
    'unhealthy: 2 uncorrected ECC errors'
    >>> fault(Gpu(1, "A100", xids=(79,)))
    'unhealthy: XID 79 (GPU 1 fell off the bus (XID 79))'
    >>> fault(Gpu(1, "A100", clocks_event_reasons=0x8)), fault(Gpu(1, "A100", xids=(13,)))
    ('unhealthy: hardware slowdown', None)
    """
    if gpu.lost:
        return f"lost: fell off the bus ({gpu.lost})"
    if gpu.ecc_uncorrected:
        plural = "s" if gpu.ecc_uncorrected > 1 else ""
        return f"unhealthy: {gpu.ecc_uncorrected} uncorrected ECC error{plural}"
    for xid in (*gpu.xids, *recorded):
        severity, what, _ = XIDS.get(xid, ("warn", "", ""))
        if severity == "fail":
            return f"unhealthy: XID {xid} ({what.format(index=gpu.index)})"
    if (gpu.clocks_event_reasons or 0) & HARDWARE_SLOWDOWN:
        return "unhealthy: hardware slowdown"
    return None


def drained(config: SiteConfig) -> frozenset[str]:
    """The GPUs the admin drained (`[gpus] drain`), as indices and UUIDs."""
    section = (config.data or {}).get("gpus") or {}
    if not isinstance(section, dict):
        raise UsageError(f"{config.path}: [gpus] must be a table")
    entries = section.get("drain", [])
    valid = isinstance(entries, list) and all(
        (isinstance(e, int) and not isinstance(e, bool) and e >= 0) or isinstance(e, str)
        for e in entries
    )
    if not valid:
        raise UsageError(
            f"{config.path}: [gpus] drain = {entries!r} is not a list of GPU indices or UUIDs",
            hint='e.g. drain = [1, "GPU-3f0e0b9d-…"]',
        )
    return frozenset(str(e) for e in entries)


def unfit_gpus(
    host: Host, env: Mapping[str, str] | None = None, now: float | None = None
) -> dict[str, str]:
    """This host's GPUs that are not to be handed out, by claim key -> why (`drained by
    the admin (…)`, `unhealthy: …`, `lost: …`)."""
    if not host.gpus:
        return {}
    config = read_site_config(env)
    out = drained(config)
    since = (time.time() if now is None else now) - RECENT_FAULT
    recorded: dict[str, list[int]] = {}
    for xid in recorded_xids(since):
        recorded.setdefault(xid.gpu, []).append(xid.xid)
    unfit = {}
    for gpu in host.gpus:
        if str(gpu.index) in out or (gpu.uuid and gpu.uuid in out):
            unfit[gpu.key] = f"drained by the admin ({config.path} [gpus] drain)"
        elif reason := fault(gpu, recorded.get(gpu.key, ())):
            unfit[gpu.key] = reason
    return unfit
