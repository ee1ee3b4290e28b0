"""Whose run a container is: the uid in its `io.gpuenv.user` label."""

from __future__ import annotations

import re


def user_uid(labels: dict[str, str]) -> int | None:
    """The uid in a run's `io.gpuenv.user` label (``alice (1000)``).

    >>> user_uid({"io.gpuenv.user": "alice (1000)"}), user_uid({})
    (1000, None)
    """
    match = re.search(r"\((\d+)\)$", labels.get("io.gpuenv.user", ""))
    return int(match.group(1)) if match else None
