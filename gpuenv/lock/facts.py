"""What a pulled image says of itself, against what gpuenv.lock says of it.

An NGC image carries its versions in its environment (``PYTORCH_BUILD_VERSION``,
``CUDA_VERSION``, ``CUDNN_VERSION``, ``NVIDIA_PYTORCH_VERSION``) and its Ubuntu in the
base image's labels, as `gpuenv matrix sync` reads them. Where the lock does not know a
value (the matrix did not record it), the image's fills it in; where the lock says one
thing and the image another, the image is not the one the lock describes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuenv.common.versions import parse_version, release_of
from gpuenv.matrix.sync import RELEASE_ENV, VERSION_ENV, environment, release_text

FIELDS = ("framework_version", "release", "cuda", "cudnn", "ubuntu")


def image_facts(framework: str, config: Mapping[str, Any] | None) -> dict[str, str]:
    """The versions an image's configuration (the engine's `Config`: Env, Labels) states."""
    if not config:
        return {}
    env, labels = environment({"config": config})
    found: dict[str, str | None] = {
        "framework_version": next(
            (env[name].strip() for name in VERSION_ENV.get(framework, ()) if env.get(name)), None
        ),
        "release": env.get(RELEASE_ENV.get(framework, ""), "").strip() or None,
        "cuda": release_text(env.get("CUDA_VERSION", ""), parts=3),
        "cudnn": release_text(env.get("CUDNN_VERSION", "")),
        "ubuntu": (
            release_text(labels.get("org.opencontainers.image.version", ""))
            if labels.get("org.opencontainers.image.ref.name") == "ubuntu"
            else None
        ),
    }
    return {key: value for key, value in found.items() if value}


def _agree(field: str, locked: str, stated: str) -> bool:
    """Whether two spellings name the same version: NVIDIA's builds are written with a
    short or a long commit (``2.9.0a0+145a3a7`` and ``2.9.0a0+145a3a7bda``); CUDA with
    or without its build number (``12.5.0`` and ``12.5.0.023``)."""
    if field in ("release", "ubuntu"):
        return locked == stated
    try:
        a, b = parse_version(locked), parse_version(stated)
    except ValueError:
        return locked == stated
    if field == "framework_version":
        if release_of(locked) != release_of(stated) or a.pre != b.pre:
            return False
        left, right = a.local or "", b.local or ""
        return left.startswith(right) or right.startswith(left)
    width = min(len(a.release), len(b.release), 3)
    return a.release[:width] == b.release[:width]


def reconcile(
    resolved: Mapping[str, Any], facts: Mapping[str, str]
) -> tuple[dict[str, Any], list[str], list[str]]:
    """(the lock's `resolved` with what it did not know filled in from the image, the
    fields filled, the contradictions: "cuda: the lock says 12.4.1, the image 12.6.2")."""
    merged = dict(resolved)
    filled, contradictions = [], []
    for field in FIELDS:
        stated = facts.get(field)
        if stated is None:
            continue
        locked = resolved.get(field)
        if locked in (None, ""):
            merged[field] = stated
            filled.append(f"{field} {stated}")
        elif not _agree(field, str(locked), stated):
            contradictions.append(f"{field}: the lock says {locked}, the image {stated}")
    return merged, filled, contradictions
