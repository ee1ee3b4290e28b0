"""Where a project is: the folder of its gpuenv.yaml (light: read at every start)."""

from __future__ import annotations

import os

SPEC_FILENAME = "gpuenv.yaml"


def find_project_dir(start: str) -> str | None:
    """The nearest folder at or above `start` that holds a gpuenv.yaml, as git, uv and
    Compose find theirs; None when no folder up to the root has one.

    >>> find_project_dir("/nonexistent/place") is None
    True
    """
    folder = os.path.abspath(start)
    while True:
        if os.path.isfile(os.path.join(folder, SPEC_FILENAME)):
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent
