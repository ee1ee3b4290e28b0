"""The run's preflight (`container.preflight`: can this host run the locked image?),
with its verdict kept in the user cache.

A run on the same host, with the same lock, the same GPU models and the same matrix
gets the same verdict, so it is judged once and then read back: a run does not load the
matrix model, the resolver and `packaging` (~40 ms of CPU on a busy 2-core server) to
learn again what it learned last time. The key is everything the verdict is made from:
the locked image's facts, the driver and the granted GPUs' models (not their indices:
claims move a run from GPU to GPU), the host's description that the refusal quotes,
the matrix files, the overlay, and gpuenv's version. A refusal is kept as well, so
it reads the same every time. Anything unexpected in the cache is a miss (`cache`).
"""

from __future__ import annotations

import json
from typing import Any

from gpuenv.common import cache
from gpuenv.errors import ResolutionError
from gpuenv.host.machine import Gpu, Host
from gpuenv.lock.locked import Locked
from gpuenv.matrix.files import default_matrix_dir, matrix_key
from gpuenv.matrix.load import load_matrix
from gpuenv.run.container import preflight
from gpuenv.sharing.gpus import Grant

KIND = "preflight"


def judge(locked: Locked, host: Host, grant: Grant) -> list[str]:
    """The preflight's warnings, or its refusal (ResolutionError), from the cache when
    this verdict was reached before."""
    key = verdict_key(locked, host, grant)
    stored = cache.load(KIND, key) if key else None
    verdict = _verdict(stored)
    if verdict is not None:
        return verdict

    try:
        warnings = preflight(locked, host, grant, load_matrix())
    except ResolutionError as exc:
        if key:
            refusal = {"message": exc.message, "explanation": exc.explanation, "hint": exc.hint}
            cache.store(KIND, key, {"refused": refusal})
        raise
    if key:
        cache.store(KIND, key, {"warnings": warnings})
    return warnings


def _verdict(stored: Any) -> list[str] | None:
    """The warnings of a stored verdict; its refusal raised; None when there is none."""
    if not isinstance(stored, dict):
        return None
    refused = stored.get("refused")
    if isinstance(refused, dict):
        message, explanation, hint = (
            refused.get("message"),
            refused.get("explanation"),
            refused.get("hint"),
        )
        if (
            isinstance(message, str)
            and isinstance(explanation, list)
            and all(isinstance(line, str) for line in explanation)
            and (hint is None or isinstance(hint, str))
        ):
            raise ResolutionError(message, explanation, hint=hint)
        return None
    warnings = stored.get("warnings")
    if isinstance(warnings, list) and all(isinstance(w, str) for w in warnings):
        return warnings
    return None


def _granted(host: Host, grant: Grant) -> list[Gpu]:
    """The GPUs the preflight judges: the granted ones (all, for a count or all), and
    the GPU of each granted MIG instance (as `container.preflight` chooses them)."""
    if grant.mode != "devices":
        return list(host.gpus)
    return [
        g
        for g in host.gpus
        if str(g.index) in grant.devices
        or g.uuid in grant.devices
        or any(m.uuid in grant.devices for m in g.mig_devices)
    ]


def verdict_key(locked: Locked, host: Host, grant: Grant) -> str | None:
    """The verdict's cache key; None when the matrix files cannot be read (the
    preflight then loads the matrix, and says what is wrong with it)."""
    try:
        matrix, _, _ = matrix_key(default_matrix_dir())
    except Exception:
        return None
    facts = {
        "image": locked.image,
        "resolved": locked.resolved,
        "requires": locked.requires,
        "driver": host.driver,
        "cuda_driver": host.cuda_driver,
        "platform": host.platform,
        "host": host.describe(),
        "mode": grant.mode,
        "gpus": sorted(
            [g.name, g.compute_capability, g.brand, g.memory_total_mib]
            for g in _granted(host, grant)
        ),
    }
    facts_bytes = json.dumps(facts, sort_keys=True, default=str).encode()
    # The matrix's key covers the matrix files, the overlay and gpuenv's version.
    return cache.digest([("matrix", matrix.encode()), ("facts", facts_bytes)])
