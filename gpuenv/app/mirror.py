"""The registry mirror this process uses (GPUENV_REGISTRY_MIRROR or the user config)."""

from __future__ import annotations

from gpuenv.errors import UsageError
from gpuenv.images.registry import InvalidMirror, registry_mirror


def configured_mirror() -> str | None:
    """GPUENV_REGISTRY_MIRROR (or the user config's registry_mirror); a bad value is a
    usage error."""
    try:
        return registry_mirror()[0]
    except InvalidMirror as exc:
        raise UsageError(str(exc)) from None
