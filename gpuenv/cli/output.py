"""The answers a command writes on stdout for scripts: its JSON (one object, also for a
failure) and plain results (an image reference, a path). No rich here: the error path
and `--json` need none."""

from __future__ import annotations

import sys
from typing import Any

from gpuenv.common import strictjson

_written = {"data": False}


def reset() -> None:
    """A new command starts (tests run several in one process)."""
    _written["data"] = False


def data(value: Any, *, once: bool = False) -> None:
    """Machine-readable output: JSON on stdout, nothing else mixed in. With `once`
    (the error path), nothing when the command already wrote its object."""
    if once and _written["data"]:
        return
    _written["data"] = True
    sys.stdout.write(strictjson.dumps(value, indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()


def result(text: str) -> None:
    """The command's answer (an image reference, a path) on stdout, plain: written as
    it is."""
    sys.stdout.write(f"{text}\n")
    sys.stdout.flush()
