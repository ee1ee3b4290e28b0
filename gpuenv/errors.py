"""One error tree for gpuenv; each class carries the exit code the CLI returns.

The exit codes are part of gpuenv's interface (docs/reference/exit-codes.md): scripts and CI
branch on them, so a code never changes meaning.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_SPEC = 3
EXIT_UNRESOLVABLE = 4
EXIT_LOCK = 5
EXIT_MATRIX = 6
EXIT_HOST = 7
EXIT_FILE = 8
EXIT_LOCKED = 9
EXIT_ENGINE = 10
EXIT_PULL = 11
EXIT_BUILD = 12
EXIT_NO_RUNTIME = 13
EXIT_START = 14
EXIT_DOCTOR = 15
EXIT_GPUS_BUSY = 16
EXIT_STATE_UNSAFE = 17
EXIT_EXPORTER = 20
EXIT_GPU_PATH = 22
EXIT_RUN_FAILED = 125
EXIT_CANNOT_INVOKE = 126
EXIT_NOT_FOUND = 127
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141


@dataclass(frozen=True)
class ExitCode:
    code: int
    meaning: str


# The one table of exit codes: `gpuenv --help` and docs/reference/exit-codes.md are made
# from it (a test checks the page), so the three can never disagree.
EXIT_CODES: tuple[ExitCode, ...] = (
    ExitCode(EXIT_OK, "success"),
    ExitCode(EXIT_INTERNAL, "internal error (a bug: please report it with --debug output)"),
    ExitCode(EXIT_USAGE, "command-line usage error (an unknown option, a bad flag value)"),
    ExitCode(EXIT_SPEC, "gpuenv.yaml (or a file it names) is invalid"),
    ExitCode(EXIT_UNRESOLVABLE, "no image fits the spec on this host"),
    ExitCode(EXIT_LOCK, "gpuenv.lock missing, damaged or out of date"),
    ExitCode(EXIT_MATRIX, "the compatibility matrix data is invalid"),
    ExitCode(EXIT_HOST, "the host description is invalid"),
    ExitCode(EXIT_FILE, "a file or folder could not be read or written (permissions, disk full)"),
    ExitCode(
        EXIT_LOCKED,
        "another gpuenv process holds a lock (it is named; retry, or stop that process)",
    ),
    ExitCode(EXIT_ENGINE, "the container engine is not reachable, not permitted or refused"),
    ExitCode(EXIT_PULL, "an image could not be pulled or pushed (unknown, refused, unreachable)"),
    ExitCode(EXIT_BUILD, "the project image failed to build"),
    ExitCode(EXIT_NO_RUNTIME, "GPUs requested, but the engine has no NVIDIA runtime"),
    ExitCode(EXIT_START, "the engine would not start the container"),
    ExitCode(EXIT_DOCTOR, "gpuenv doctor found a failing check"),
    ExitCode(EXIT_GPUS_BUSY, "not enough free GPUs (see gpuenv top; --wait to queue)"),
    ExitCode(
        EXIT_STATE_UNSAFE, "the shared state folder is unsafe (a symbolic link, or another user's)"
    ),
    ExitCode(EXIT_EXPORTER, "gpuenv exporter or dashboard cannot listen on the address given"),
    ExitCode(
        EXIT_GPU_PATH, "the engine's CDI specs cannot give the requested GPUs (gpuenv doctor)"
    ),
    ExitCode(
        EXIT_RUN_FAILED,
        "run, shell, notebook, wait, attach: gpuenv itself failed "
        "(the reason's code is in the message)",
    ),
    ExitCode(EXIT_CANNOT_INVOKE, "run, shell: the command cannot be invoked (not executable)"),
    ExitCode(EXIT_NOT_FOUND, "run, shell: the command was not found in the image"),
    ExitCode(EXIT_INTERRUPTED, "interrupted (Ctrl-C)"),
    ExitCode(
        EXIT_BROKEN_PIPE,
        "stdout or stderr was closed early (its reader, e.g. head, quit): as SIGPIPE, "
        "from any command, run and shell included",
    ),
)
COMMAND_EXIT_NOTE = (
    "run, shell, notebook, wait and attach exit with the command's own exit code once it has "
    "started; their own failures are 125-127, as docker run's."
)

# The commands whose exit code is their container command's: gpuenv's own failures there
# are Docker's 125 (126, 127: the command cannot be invoked, is not found), so that CI can
# tell them from the command's codes (pytest's 5 is not gpuenv's 5).
PASS_THROUGH_COMMANDS = frozenset({"run", "shell", "notebook", "wait", "attach"})


def exit_codes_help() -> str:
    """The exit-code table as `--help` shows it (click's \\b keeps the lines)."""
    rows = [f"  {entry.code:<4} {entry.meaning}" for entry in EXIT_CODES]
    return "\b\nExit codes:\n" + "\n".join(rows) + f"\n  {COMMAND_EXIT_NOTE}\n"


@dataclass(frozen=True)
class Problem:
    """One located problem in a file: what is wrong, where, and (optionally) what to do.

    >>> str(Problem("gpuenv.yaml", 4, 7, "cuda", "'12.x' is not a version specifier"))
    "gpuenv.yaml:4:7: field 'cuda': '12.x' is not a version specifier"
    """

    file: str
    line: int | None
    column: int | None
    field: str | None
    message: str

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        what = f"field '{self.field}': " if self.field else ""
        return f"{where}: {what}{self.message}"


class GpuenvError(Exception):
    """Base of every error gpuenv reports to a user (never shown with a traceback)."""

    exit_code = EXIT_INTERNAL

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class GpuenvWarning(UserWarning):
    """Something a user should know that does not stop the command; the CLI shows it
    as `warning: ...` on stderr (core packages cannot print)."""


class UsageError(GpuenvError):
    """Command-line arguments that make no sense together."""

    exit_code = EXIT_USAGE


class ProblemsError(GpuenvError):
    """An error made of several located problems, all reported at once."""

    kind = "file"

    def __init__(self, problems: Sequence[Problem], *, hint: str | None = None) -> None:
        self.problems = tuple(problems)
        count = len(self.problems)
        noun = "problem" if count == 1 else "problems"
        files = sorted({p.file for p in self.problems})
        lines = "\n".join(f"  {p}" for p in self.problems)
        if count == 1:
            message = str(self.problems[0])
        else:
            message = f"{count} {noun} in {', '.join(files)}:\n{lines}"
        super().__init__(message, hint=hint)


class SpecError(ProblemsError):
    """gpuenv.yaml (or a file it names) is invalid."""

    exit_code = EXIT_SPEC


class MatrixError(ProblemsError):
    """The compatibility matrix data is invalid (a packaging or editing mistake)."""

    exit_code = EXIT_MATRIX


class HostError(GpuenvError):
    """The host description (flags or GPUENV_HOST_FILE) is invalid."""

    exit_code = EXIT_HOST


class HostFileError(ProblemsError, HostError):
    """A host file (GPUENV_HOST_FILE) is invalid: every problem, located."""

    exit_code = EXIT_HOST

    @classmethod
    def single(cls, where: str, message: str) -> HostFileError:
        return cls([Problem(where, None, None, None, message)])


class LockError(GpuenvError):
    """gpuenv.lock is missing, unreadable, or no longer matches the spec."""

    exit_code = EXIT_LOCK


class ResolutionError(GpuenvError):
    """No image satisfies the spec on the host; `explanation` says why, line by line."""

    exit_code = EXIT_UNRESOLVABLE

    def __init__(
        self, message: str, explanation: Iterable[str] = (), *, hint: str | None = None
    ) -> None:
        super().__init__(message, hint=hint)
        self.explanation = tuple(explanation)
        # The resolver's Candidate list, and the host they were judged against, for
        # `resolve --explain` after a failure.
        self.candidates: tuple[object, ...] = ()
        self.host: Any = None  # a gpuenv.host.machine.Host


class EngineError(GpuenvError):
    """The Docker engine cannot be reached or used (not running, no permission)."""

    exit_code = EXIT_ENGINE


class EngineRefused(EngineError):
    """The engine answered a request with an error status (a conflict, a missing object,
    a refused option): never a bug in gpuenv, so never exit 1."""

    def __init__(self, status: int, message: str, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.status = status


class PullError(GpuenvError):
    """An image could not be pulled: unknown, refused by the registry, or unreachable."""

    exit_code = EXIT_PULL


class BuildError(GpuenvError):
    """The project image failed to build; `step` and `output` say where and what."""

    exit_code = EXIT_BUILD

    def __init__(
        self,
        message: str,
        *,
        step: str | None = None,
        output: Sequence[str] = (),
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.step = step
        self.output = tuple(output)


class StartError(GpuenvError):
    """The engine would not start the container (a mount, a limit, the image's command)."""

    exit_code = EXIT_START


class GpuRuntimeMissing(GpuenvError):
    """A GPU was requested, but the engine has no NVIDIA runtime."""

    exit_code = EXIT_NO_RUNTIME


class GpuPathBroken(GpuRuntimeMissing):
    """The engine takes GPUs through CDI, but its specs do not name the granted GPUs, or
    it cannot read them (too new a cdiVersion, stale after a driver upgrade)."""

    exit_code = EXIT_GPU_PATH


class GpusBusy(GpuenvError):
    """Not enough free GPUs on this host (and no --wait, or it timed out)."""

    exit_code = EXIT_GPUS_BUSY


class FileAccessError(GpuenvError):
    """A file or folder could not be read or written: permissions, a read-only file
    system, a full disk. The environment's problem, never a bug; `path` names it."""

    exit_code = EXIT_FILE

    def __init__(self, message: str, *, path: str | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.path = path


class LockHeld(GpuenvError):
    """Another process has held a gpuenv lock for longer than the timeout (it is named)."""

    exit_code = EXIT_LOCKED


_FILE_PROBLEMS = {
    "EACCES": (
        "permission denied",
        "check who may {action} it (`ls -ld {path}`): fix its "
        "permissions or owner, or run gpuenv as a user who may",
    ),
    "EPERM": (
        "operation not permitted",
        "check who may {action} it (`ls -ld {path}`): fix its "
        "permissions or owner, or run gpuenv as a user who may",
    ),
    "EROFS": (
        "read-only file system",
        "work in a writable copy of the project, or remount that file system read-write",
    ),
    "ENOSPC": (
        "no space left on device",
        "free space on that file system (`df -h {folder}`) "
        "and retry; gpuenv writes through a temporary file, so the old file is unchanged",
    ),
    "EDQUOT": (
        "disk quota exceeded",
        "free space within your quota (`quota -s`) and retry; "
        "gpuenv writes through a temporary file, so the old file is unchanged",
    ),
    "EIO": (
        "input/output error",
        "the disk or network file system failed: check `dmesg` and the mount, then retry",
    ),
}


def file_error(
    exc: OSError, action: str = "access", path: str | None = None, *, folder: bool = False
) -> FileAccessError:
    """An OSError from reading or writing a file, as a message with the path and the fix.

    >>> import errno
    >>> error = file_error(PermissionError(errno.EACCES, "Permission denied", "/p/a.txt"), "read")
    >>> error.message, error.exit_code
    ('cannot read /p/a.txt: permission denied', 8)
    """
    where = path or exc.filename
    where = os.fsdecode(where) if where is not None else None
    name = errno.errorcode.get(exc.errno or 0, "")
    what, hint = _FILE_PROBLEMS.get(name, (exc.strerror or str(exc), None))
    subject = f" {where}" if where else ""
    parent = (os.path.dirname(where) or ".") if where else "."
    if folder:  # the folder refused the temporary file: it is the one to look at
        what = f"{what} (creating a file in {parent})"
    shown = parent if folder else where or "."
    return FileAccessError(
        f"cannot {action}{subject}: {what}",
        path=where,
        hint=hint.format(action=action, path=shown, folder=parent) if hint else None,
    )


class ExporterError(GpuenvError):
    """`gpuenv exporter` or `dashboard` cannot serve (the address is taken, not local, not
    permitted)."""

    exit_code = EXIT_EXPORTER


class StateUnsafe(GpuenvError):
    """The state folder, or a file in it, could let another user tamper with claims."""

    exit_code = EXIT_STATE_UNSAFE


def pass_through_code(exc: GpuenvError | None) -> int:
    """The exit code of a pass-through command that failed itself: 127 when the engine
    says the command's executable is missing, 126 when it cannot be executed, else 125.
    The same reading of the engine's message as the Docker CLI's (cli/command/container/
    run.go, runStartContainerErr).

    >>> pass_through_code(StartError('exec: "trian.py": executable file not found in $PATH'))
    127
    >>> pass_through_code(StartError("exec /workspace/run.sh: permission denied"))
    126
    >>> pass_through_code(GpusBusy("no free GPU")), pass_through_code(None)
    (125, 125)
    """
    if isinstance(exc, StartError):
        text = exc.message
        if "executable file not found" in text or "no such file or directory" in text:
            return EXIT_NOT_FOUND
        if "permission denied" in text or "is a directory" in text:
            return EXIT_CANNOT_INVOKE
    return EXIT_RUN_FAILED
