"""The `gpuenv` command: parse, call one core function, show the result.

`main` is the click command tree (`tree`); its command groups are loaded lazily, one
module per group, so `gpuenv --version` loads none of them.
"""

from __future__ import annotations

from gpuenv.cli.tree import COMMANDS, main

__all__ = ["COMMANDS", "entry", "main"]


def entry() -> None:
    """The console script `gpuenv` (and `python -m gpuenv.cli`)."""
    main()
