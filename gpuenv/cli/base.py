"""What the commands share that needs no click: the one error path (an exception to its
message and exit code), the engine and the progress view the CLI plugs into the core."""

from __future__ import annotations

import errno
import os
import sys
import traceback
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpuenv.cli.quiet import QuietView
from gpuenv.common.text import visible
from gpuenv.errors import (
    BuildError,
    GpuenvError,
    GpuenvWarning,
    ResolutionError,
    file_error,
)

if TYPE_CHECKING:  # annotations only: `gpuenv --version` loads none of the core
    from gpuenv.images.progress import View


def say(text: str) -> None:
    """A line on stderr, at once (as click.echo(text, err=True) writes it)."""
    sys.stderr.write(f"{visible(text, lines=True)}\n")
    sys.stderr.flush()


def report(exc: GpuenvError) -> None:
    """An error as the user sees it: the message, its details, the hint (stderr)."""
    from gpuenv.cli import ui  # rich: loaded when there is something to say, not for --version

    ui.error(exc.message)
    if isinstance(exc, ResolutionError):
        for line in exc.explanation:
            ui.detail(line)
    if isinstance(exc, BuildError) and exc.output:
        ui.info("last lines of its output:")
        for line in exc.output:
            ui.detail(line)
    if exc.hint:
        ui.hint(exc.hint)


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
        from gpuenv.cli import ui  # rich: loaded when there is something to say

        ui.warn(str(message))
    else:
        _python_showwarning(message, category, filename, lineno, file, line)


def stdout_closed() -> None:
    """The reader of stdout went away (`gpuenv ... | head -1`): point stdout at
    /dev/null so that the flush at exit cannot fail again (Python's documented
    handling of SIGPIPE, in the signal module's notes)."""
    _to_devnull(sys.stdout)


def streams_closed() -> None:
    """The reader of stdout and stderr went away (`gpuenv build 2>&1 | head -1`, and the
    error message met the closed pipe): both to /dev/null, as `stdout_closed`."""
    _to_devnull(sys.stdout)
    _to_devnull(sys.stderr)


def _to_devnull(stream: Any) -> None:
    try:
        target = stream.fileno()
    except (OSError, ValueError, AttributeError):  # not a real file (a test's capture)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, target)
    os.close(devnull)


def print_traceback() -> None:
    traceback.print_exc()


def view_factory(quiet: bool) -> Callable[[], View]:
    """The progress view for pulls and builds, made (with rich, unless quiet) only if one
    happens."""

    def make() -> View:
        if quiet:
            return QuietView()
        from gpuenv.cli.live import make_view  # rich's live view: only when one is shown

        return make_view(quiet)

    return make


def up_to_date(tag: str, quiet: bool) -> None:
    """What `gpuenv build` says when there is nothing to build: the tag on stdout."""
    sys.stdout.write(f"{tag}\n")
    sys.stdout.flush()
    if not quiet:
        say("✓ up to date: nothing to build")
