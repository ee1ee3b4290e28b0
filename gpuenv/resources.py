"""Where gpuenv's data folders are: inside the installed wheel, or in the source tree."""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """``matrices`` or ``images``: in the installed wheel (gpuenv/_data), else the repo."""
    packaged = _HERE / "_data" / name
    return packaged if packaged.is_dir() else _HERE.parent / name
