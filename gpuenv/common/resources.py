"""Where gpuenv's data folders are: inside the installed wheel, or in the source tree."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]


def data_dir(name: str) -> Path:
    """``matrices`` or ``images``: in the installed wheel (gpuenv/_data), else the repo."""
    packaged = _PACKAGE / "_data" / name
    return packaged if packaged.is_dir() else _PACKAGE.parent / name
