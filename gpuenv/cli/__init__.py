"""The `gpuenv` command: parse, call one application function, show the result.

The click command tree is `gpuenv.cli.tree.main`; its command groups are loaded lazily,
one module per group, so `gpuenv --version` loads none of them. This package's own
import loads nothing: a CLI module imported alone (`from gpuenv.cli import ui`) does
not drag the tree in, and no import runs back into a half-loaded package.
"""

from __future__ import annotations


def entry() -> None:
    """The console script `gpuenv` (and `python -m gpuenv.cli`)."""
    from gpuenv.cli.tree import main  # the tree when the command runs, not on import

    main()
