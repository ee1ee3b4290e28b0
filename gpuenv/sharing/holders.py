"""Who holds a GPU claim that no gpuenv process holds: a detached run's container, as
the claims store asks (`ClaimStore.container_check`). Apart from `monitor`, so that a
run asks without loading `ps` and `top`'s rows and the health rules."""

from __future__ import annotations

import re
from collections.abc import Callable

from gpuenv.common.labels import RUN_LABEL
from gpuenv.engine.protocol import ContainerEngine
from gpuenv.errors import EngineRefused, GpuenvError


def user_uid(labels: dict[str, str]) -> int | None:
    """The uid in a run's `io.gpuenv.user` label (``alice (1000)``)."""
    match = re.search(r"\((\d+)\)$", labels.get("io.gpuenv.user", ""))
    return int(match.group(1)) if match else None


def container_check(engine: ContainerEngine) -> Callable[[str, int], bool]:
    """For the claims store: does a detached run's container still run, as `uid`'s run?
    A container that is gone, stopped, or someone else's holds no GPU; an engine that
    cannot be asked keeps the claim (better a GPU held too long than given twice)."""

    def holds(container: str, uid: int) -> bool:
        try:
            data = engine.inspect(container)
        except EngineRefused as exc:
            return exc.status != 404
        except GpuenvError:
            return True
        labels = (data.get("Config") or {}).get("Labels") or {}
        running = bool((data.get("State") or {}).get("Running"))
        return running and labels.get(RUN_LABEL) == "1" and (uid == 0 or user_uid(labels) == uid)

    return holds
