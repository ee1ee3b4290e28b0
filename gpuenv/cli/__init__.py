"""The `gpuenv` command: parse, call one core function, show the result.

`entry` is the command (the console script and `python -m gpuenv.cli`): the plain forms
of `gpuenv run` and the no-op `gpuenv build` take a path without click (`fast`), every
other command line goes to the click command tree, `main` (`tree`), which is loaded
lazily, as its commands are (one module per command group).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from click import Group

    main: Group


def entry() -> None:
    from gpuenv.cli.fast import entry as fast_entry

    fast_entry()


def __getattr__(name: str) -> Any:
    """`main`, the click command tree (for `CliRunner`, the docs), imported on first use."""
    if name in ("main", "COMMANDS"):
        from gpuenv.cli import tree

        return getattr(tree, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
