"""Which project a command works on: the folder given, or the nearest one at or above
where gpuenv was started that holds a gpuenv.yaml."""

from __future__ import annotations

import os

from gpuenv.project.location import find_project_dir


def project_folder(start: str, *, search: bool) -> tuple[str, str]:
    """The project folder and the subfolder of it gpuenv was started in ("" when it is
    the folder itself). With `search`, the nearest folder at or above `start` with a
    gpuenv.yaml, as git, uv and Compose find theirs; else `start` itself."""
    folder = os.path.abspath(start)
    found = find_project_dir(folder) if search else None
    if found is None or found == folder:
        return folder, ""
    return found, os.path.relpath(folder, found)
