"""What the commands share that needs no click: the one error path (an exception to its
message and exit code), the engine and the progress view the CLI plugs into the core.

The click command tree (`tree`, `app`) and the fast path (`fast`) both use these, so a
command gives the same messages and exit codes whichever way it was parsed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpuenv.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, GpuenvError

if TYPE_CHECKING:
    from gpuenv.engine.protocol import Engine
    from gpuenv.images.service import View


def say(text: str) -> None:
    """A line on stderr, at once (as click.echo(text, err=True) writes it)."""
    sys.stderr.write(f"{text}\n")
    sys.stderr.flush()


def report(exc: GpuenvError) -> None:
    """An error as the user sees it: the message, its details, the hint (stderr)."""
    from rich.markup import escape

    from gpuenv.cli import ui
    from gpuenv.errors import BuildError, ResolutionError

    ui.error(exc.message)
    if isinstance(exc, ResolutionError):
        for line in exc.explanation:
            ui.detail(line)
    if isinstance(exc, BuildError) and exc.output:
        ui.info("last lines of its output:")
        for line in exc.output:
            ui.detail(line)
    if exc.hint:
        ui.err.print(f"[cyan]hint:[/] {escape(exc.hint)}")


def debugging(flag: bool = False) -> bool:
    """--debug, or GPUENV_DEBUG=1."""
    return flag or os.environ.get("GPUENV_DEBUG") == "1"


def exit_code_for(exc: Exception | KeyboardInterrupt, debug: bool) -> int:
    """Tell the user about an exception that ended a command; the exit code to end with.
    Every gpuenv error is one message and its code; a traceback only with --debug."""
    if isinstance(exc, GpuenvError):
        report(exc)
        if debug:
            _traceback()
        return exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        say("interrupted")
        return EXIT_INTERRUPTED
    if debug:
        _traceback()
    say(
        f"error: internal error: {type(exc).__name__}: {exc}\n"
        "hint: this is a bug in gpuenv; run again with --debug and report the traceback"
    )
    return EXIT_INTERNAL


def _traceback() -> None:
    import traceback

    traceback.print_exc()


def engine() -> Engine:
    """The engine at DOCKER_HOST (the Unix-socket client, or docker-py for tcp/ssh)."""
    from gpuenv.engine import connect

    return connect()


def view_factory(quiet: bool) -> Callable[[], View]:
    """The progress view for pulls and builds, made (with rich) only if one happens."""

    def make() -> View:
        from gpuenv.cli.live import make_view

        return make_view(quiet)

    return make


def up_to_date(tag: str, quiet: bool) -> None:
    """What `gpuenv build` says when there is nothing to build: the tag on stdout."""
    sys.stdout.write(f"{tag}\n")
    sys.stdout.flush()
    if not quiet:
        say("✓ up to date: nothing to build")
