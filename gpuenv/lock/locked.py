"""What a run needs of gpuenv.lock: small, and kept in the build stamp, so that
`gpuenv run` reads no YAML and loads none of the lock reader (`Lock.locked` makes it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

LOCK_FILENAME = "gpuenv.lock"
# How a command treats a lock whose Python packages are older than the requirements:
# `update` re-resolves them (build, run: as `uv run` does), `locked` refuses (exit 5, for
# CI), `frozen` uses the lock as it is.
Freshness = Literal["update", "locked", "frozen"]


@dataclass(frozen=True)
class Locked:
    """What a run needs of gpuenv.lock (kept in the build stamp, so a run reads no YAML)."""

    image: str
    lock_hash: str
    resolved: dict[str, Any] = field(default_factory=dict)
    requires: dict[str, Any] = field(default_factory=dict)

    def to_data(self) -> dict[str, Any]:
        return {
            "image": self.image,
            "lock_hash": self.lock_hash,
            "resolved": self.resolved,
            "requires": self.requires,
        }
