"""Where gpuenv talks to people, with rich: status and messages on stderr, tables on
stdout (the data a script reads goes through `output`).

Text that comes from elsewhere (file contents, Docker output, GPU names, other users'
commands and project names) is never markup: messages escape it, table cells go through
`cell`, so a `[bold]` or a `[/]` in it is shown, not interpreted (nor a crash); control
bytes and bidirectional overrides in it are shown as escapes, never sent to the terminal
(`gpuenv.common.text.visible`). Emoji codes are off everywhere, so `/data:x:` stays
`/data:x:`.
"""

from __future__ import annotations

import os
import sys

from rich.console import Console
from rich.markup import escape as escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from gpuenv.common.text import CELL_LIMIT, visible


class _PipeConsole(Console):
    def on_broken_pipe(self) -> None:
        """The reader went away: the CLI's one error path handles it (exit 141, as
        SIGPIPE), not rich's exit 1."""
        self.quiet = True
        raise BrokenPipeError


def _make_console(*, stderr: bool) -> Console:
    # NO_COLOR (no-color.org), honoured fully: no ANSI styling at all, bold and dim
    # included (rich alone drops only the colours).
    plain = os.environ.get("NO_COLOR", "") != ""
    return _PipeConsole(
        stderr=stderr,
        highlight=False,
        emoji=False,  # ':x:' in a path or a message is text, never ❌
        soft_wrap=True,
        no_color=plain or None,
        color_system=None if plain else "auto",
    )


err = _make_console(stderr=True)  # status, messages, progress
out = _make_console(stderr=False)  # tables and the data the command was asked for


def table(table: Table) -> None:
    """A table on stdout: drawn for a terminal wide enough for it; otherwise (a pipe, a
    file, a narrow terminal) plain lines, a header then a row a line, cells separated
    by tabs and never wrapped, markup and styles dropped: `cut -f2` and `awk -F'\t'`
    read them. The title then goes to stderr."""
    console = out
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
    text = cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell), emoji=False).plain
    return text.replace("\t", " ").replace("\n", "; ")


def cell(text: object, limit: int = CELL_LIMIT) -> str:
    """Text from elsewhere as a table cell (or a piece of one): markup escaped, control
    characters shown, cut at `limit` characters (the whole text is in --json)."""
    return escape(visible(str(text), limit=limit))


def safe(text: str) -> str:
    """A message's text for markup: escaped, control characters shown, lines kept."""
    return escape(visible(text, lines=True))


def info(text: str) -> None:
    err.print(visible(text, lines=True), markup=False)


def step(text: str) -> None:
    err.print(f"[bold]•[/] {safe(text)}")


def success(text: str) -> None:
    err.print(f"[green]✓[/] {safe(text)}")


def warn(text: str) -> None:
    err.print(f"[yellow]warning:[/] {safe(text)}")


def error(text: str) -> None:
    err.print(f"[red bold]error:[/] {safe(text)}")


def hint(text: str) -> None:
    err.print(f"[cyan]hint:[/] {safe(text)}")


def detail(text: str) -> None:
    err.print(f"  {safe(text)}", style="dim")


def size_text(count: int) -> str:
    """Bytes for people: 512 B, 3.4 MB, 1.2 GB."""
    value = float(count)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} GB"
