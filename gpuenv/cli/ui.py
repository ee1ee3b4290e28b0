"""The one place gpuenv talks to people: status on stderr, data on stdout.

Text that comes from elsewhere (file contents, Docker output, GPU names) is printed
with markup off, so a `[bold]` in it is shown, not interpreted.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

_consoles: dict[str, Console] = {}


def _console(name: str) -> Console:
    """The stderr (`err`) or stdout (`out`) console, made on first use: a command whose
    output is JSON alone never imports rich."""
    console = _consoles.get(name)
    if console is None:
        from rich.console import Console

        console = Console(stderr=name == "err", highlight=False, soft_wrap=True)
        _consoles[name] = console
    return console


def __getattr__(name: str) -> Console:
    if name in ("err", "out"):
        return _console(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def escape(text: str) -> str:
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def data(value: Any) -> None:
    """Machine-readable output: JSON on stdout, nothing else mixed in."""
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()


def result(text: str) -> None:
    """The command's answer (an image reference, a path) on stdout, plain."""
    _console("out").print(text, markup=False)


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
