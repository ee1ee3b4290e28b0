"""The one place gpuenv talks to people: status on stderr, data on stdout.

Text that comes from elsewhere (file contents, Docker output, GPU names) is printed
with markup off, so a `[bold]` in it is shown, not interpreted.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.markup import escape

err = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)


def data(value: Any) -> None:
    """Machine-readable output: JSON on stdout, nothing else mixed in."""
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()


def result(text: str) -> None:
    """The command's answer (an image reference, a path) on stdout, plain."""
    out.print(text, markup=False)


def info(text: str) -> None:
    err.print(text, markup=False)


def step(text: str) -> None:
    err.print(f"[bold]•[/] {escape(text)}")


def success(text: str) -> None:
    err.print(f"[green]✓[/] {escape(text)}")


def warn(text: str) -> None:
    err.print(f"[yellow]warning:[/] {escape(text)}")


def error(text: str, hint: str | None = None) -> None:
    err.print(f"[red bold]error:[/] {escape(text)}")
    if hint:
        err.print(f"[cyan]hint:[/] {escape(hint)}")


def detail(text: str) -> None:
    err.print(f"  {escape(text)}", style="dim")
