"""The one place gpuenv talks to people: status on stderr, data on stdout.

Text that comes from elsewhere (file contents, Docker output, GPU names) is printed
with markup off, so a `[bold]` in it is shown, not interpreted.
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

_consoles: dict[str, Console] = {}
_written = {"data": False}


def _console(name: str) -> Console:
    """The stderr (`err`) or stdout (`out`) console, made on first use: a command whose
    output is JSON alone never imports rich."""
    console = _consoles.get(name)
    if console is None:
        from rich.console import Console

        class PipeConsole(Console):
            def on_broken_pipe(self) -> None:
                """The reader went away: the CLI's one error path handles it (exit
                141, as SIGPIPE), not rich's exit 1."""
                self.quiet = True
                raise BrokenPipeError

        # NO_COLOR (no-color.org), honoured fully: no ANSI styling at all, bold and dim
        # included (rich alone drops only the colours).
        plain = os.environ.get("NO_COLOR", "") != ""
        console = PipeConsole(
            stderr=name == "err",
            highlight=False,
            soft_wrap=True,
            no_color=plain or None,
            color_system=None if plain else "auto",
        )
        _consoles[name] = console
    return console


def __getattr__(name: str) -> Console:
    if name in ("err", "out"):
        return _console(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def escape(text: str) -> str:
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def reset() -> None:
    """A new command starts (tests run several in one process)."""
    _written["data"] = False


def data(value: Any, *, once: bool = False) -> None:
    """Machine-readable output: JSON on stdout, nothing else mixed in. With `once`
    (the error path), nothing when the command already wrote its object."""
    if once and _written["data"]:
        return
    _written["data"] = True
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()


def result(text: str) -> None:
    """The command's answer (an image reference, a path) on stdout, plain: written as
    it is, so a quiet command (`build -q`, `resolve`) need not load rich to say it."""
    sys.stdout.write(f"{text}\n")
    sys.stdout.flush()


def table(table: Table) -> None:
    """A table on stdout: drawn for a terminal wide enough for it; otherwise (a pipe, a
    file, a narrow terminal) plain lines, a header then a row a line, cells separated
    by tabs and never wrapped, markup and styles dropped: `cut -f2` and `awk -F'\t'`
    read them. The title then goes to stderr."""
    from rich.measure import Measurement

    console = _console("out")
    if console.is_terminal:
        # The width it needs unwrapped (rich clamps a measure to the options' width).
        width = Measurement.get(console, console.options.update_width(1 << 16), table).maximum
        if width <= console.width:
            console.print(table)
            return
    if table.title:
        info(_plain(table.title))
    lines = ["\t".join(_plain(column.header) for column in table.columns)]
    cells = [list(column.cells) for column in table.columns]
    for index in range(table.row_count):
        lines.append("\t".join(_plain(column[index]) for column in cells))
    sys.stdout.write("\n".join(lines) + "\n")


def _plain(cell: object) -> str:
    """A cell's text without markup; a line break or a tab inside it becomes '; ' / ' '."""
    from rich.text import Text

    text = cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell)).plain
    return text.replace("\t", " ").replace("\n", "; ")


def info(text: str) -> None:
    _console("err").print(text, markup=False)


def step(text: str) -> None:
    _console("err").print(f"[bold]•[/] {escape(text)}")


def success(text: str) -> None:
    _console("err").print(f"[green]✓[/] {escape(text)}")


def warn(text: str) -> None:
    _console("err").print(f"[yellow]warning:[/] {escape(text)}")


def error(text: str, hint: str | None = None) -> None:
    _console("err").print(f"[red bold]error:[/] {escape(text)}")
    if hint:
        _console("err").print(f"[cyan]hint:[/] {escape(hint)}")


def detail(text: str) -> None:
    _console("err").print(f"  {escape(text)}", style="dim")
