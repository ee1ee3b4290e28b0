"""What the commands share that needs no click: the one error path (an exception to its
message and exit code), the engine and the progress view the CLI plugs into the core.

The click command tree (`tree`, `app`) and the fast path (`fast`) both use these, so a
command gives the same messages and exit codes whichever way it was parsed.
"""

from __future__ import annotations

import errno
import os
import sys
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpuenv.errors import (
    EXIT_BROKEN_PIPE,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    GpuenvError,
    GpuenvWarning,
    file_error,
)

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


# An OSError without a file name is still the environment's when it is one of these.
FILE_ERRNOS = frozenset(
    {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EIO}
)


def as_gpuenv_error(exc: BaseException) -> GpuenvError | None:
    """The gpuenv error an exception is to the user: itself, or an OSError of the
    environment (permissions, a full disk, a read-only folder) as exit 8; None for a bug."""
    if isinstance(exc, GpuenvError):
        return exc
    if not isinstance(exc, OSError) or isinstance(exc, BrokenPipeError):
        return None
    if exc.filename is not None or exc.errno in FILE_ERRNOS:
        return file_error(exc)
    return None


def exit_code_for(exc: BaseException, debug: bool) -> int:
    """Tell the user about an exception that ended a command; the exit code to end with.
    Every gpuenv error is one message and its code; a traceback only with --debug; a
    closed stdout is SIGPIPE's code, with no message."""
    if isinstance(exc, BrokenPipeError):
        stdout_closed()
        return EXIT_BROKEN_PIPE
    if isinstance(exc, KeyboardInterrupt):
        say("interrupted")
        return EXIT_INTERRUPTED
    error = as_gpuenv_error(exc)
    if error is not None:
        report(error)
        if debug:
            print_traceback()
        return error.exit_code
    internal(exc, debug)
    return EXIT_INTERNAL


def internal(exc: BaseException, debug: bool) -> None:
    """A bug: what it is, and how to report it (the traceback with --debug)."""
    if debug:
        print_traceback()
    say(
        f"error: internal error: {type(exc).__name__}: {exc}\n"
        "hint: this is a bug in gpuenv; run again with --debug and report the traceback"
    )


_python_showwarning = warnings.showwarning


def show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    """A GpuenvWarning from the core as `warning: ...` on stderr; others as Python's."""
    if issubclass(category, GpuenvWarning):
        from gpuenv.cli import ui

        ui.warn(str(message))
    else:
        _python_showwarning(message, category, filename, lineno, file, line)


def stdout_closed() -> None:
    """The reader of stdout went away (`gpuenv ... | head -1`): point stdout at
    /dev/null so that the flush at exit cannot fail again (Python's documented
    handling of SIGPIPE, in the signal module's notes)."""
    try:
        target = sys.stdout.fileno()
    except (OSError, ValueError):  # not a real file (a test's capture): nothing to flush
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, target)
    os.close(devnull)


def print_traceback() -> None:
    import traceback

    traceback.print_exc()


def engine() -> Engine:
    """The engine the environment names (DOCKER_HOST, CONTAINER_HOST, GPUENV_ENGINE)."""
    from gpuenv.engine import connect

    return connect()


def view_factory(quiet: bool) -> Callable[[], View]:
    """The progress view for pulls and builds, made (with rich, unless quiet) only if one
    happens."""

    def make() -> View:
        # A pull or build takes long: the garbage collection the fast path holds off
        # while a run starts comes back for it.
        import gc

        gc.enable()
        if quiet:
            from gpuenv.cli.quiet import QuietView

            return QuietView()
        from gpuenv.cli.live import make_view

        return make_view(quiet)

    return make


def up_to_date(tag: str, quiet: bool) -> None:
    """What `gpuenv build` says when there is nothing to build: the tag on stdout."""
    sys.stdout.write(f"{tag}\n")
    sys.stdout.flush()
    if not quiet:
        say("✓ up to date: nothing to build")
