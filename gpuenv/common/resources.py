"""Where gpuenv's data folders are: inside the installed wheel, or in the source tree."""

from __future__ import annotations

import os

# Plain os.path, no pathlib: this runs on every command, and pathlib costs ~8 ms to import.
_PACKAGE = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def data_dir(name: str) -> str:
    """``matrices`` or ``images``: in the installed wheel (gpuenv/_data), else the repo."""
    packaged = os.path.join(_PACKAGE, "_data", name)
    return packaged if os.path.isdir(packaged) else os.path.join(os.path.dirname(_PACKAGE), name)
