"""The commands typed most often, without loading click (~50 ms): `gpuenv run` and a
`gpuenv build` that has nothing to do, in their plain forms.

    gpuenv [-C DIR] run [--gpus GPUS] [-q] -- CMD [ARGS]...
    gpuenv [-C DIR] run [--gpus GPUS] [-q] TARGET [ARGS]...
    gpuenv [-C DIR] build [--bake] [-q]

`parse` reads exactly these forms and nothing else; any other command line (another
option, --help, a value that looks like an option, a folder click would refuse) is
left to the click command tree, which also handles everything when the no-op build
finds something to build. Both paths call the same functions and take the same error
path (`base.exit_code_for`), so the output and the exit code are the same; the tests
hold them side by side.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from gpuenv.records import record


@record
class FastCommand:
    """A command line the fast path takes: the command, the project folder, its options."""

    name: str  # "run" or "build"
    directory: str
    quiet: bool = False
    gpus: str | None = None
    bake: bool = False
    arguments: tuple[str, ...] = ()


def _folder(value: str) -> bool:
    """A folder click's `-C` accepts (it exists, is a folder, is readable)."""
    return os.path.isdir(value) and os.access(value, os.R_OK)


def parse(argv: Sequence[str]) -> FastCommand | None:
    """The fast path's reading of a command line, or None to leave it to click.

    >>> parse(["run", "--gpus", "1", "--", "true"])
    FastCommand(name='run', directory='.', quiet=False, gpus='1', bake=False, arguments=('true',))
    >>> parse(["run", "--memory", "8g", "--", "true"]) is None
    True
    """
    index, directory = 0, "."
    while index < len(argv) and argv[index].startswith("-"):
        token = argv[index]
        if token in ("-C", "--directory") and index + 1 < len(argv):
            directory, index = argv[index + 1], index + 2
        elif token.startswith("--directory="):
            directory, index = token.partition("=")[2], index + 1
        else:
            return None
    if index >= len(argv) or not _folder(directory):
        return None
    name, rest = argv[index], argv[index + 1 :]
    if name == "build":
        return _parse_build(directory, rest)
    if name == "run":
        return _parse_run(directory, rest)
    return None


def _parse_build(directory: str, rest: Sequence[str]) -> FastCommand | None:
    quiet = bake = False
    for token in rest:
        if token in ("-q", "--quiet"):
            quiet = True
        elif token == "--bake":
            bake = True
        else:
            return None
    return FastCommand("build", directory, quiet=quiet, bake=bake)


def _parse_run(directory: str, rest: Sequence[str]) -> FastCommand | None:
    quiet, gpus, index = False, None, 0
    while index < len(rest):
        token = rest[index]
        if token in ("-q", "--quiet"):
            quiet, index = True, index + 1
        elif token == "--gpus" and index + 1 < len(rest) and not rest[index + 1].startswith("-"):
            gpus, index = rest[index + 1], index + 2
        elif token.startswith("--gpus=") and not token.startswith("--gpus=-"):
            gpus, index = token.partition("=")[2], index + 1
        elif token == "--":
            index += 1
            break
        elif token.startswith("-"):
            return None
        else:
            break
    arguments = tuple(rest[index:])
    if not arguments:
        return None  # click says what is missing
    return FastCommand("run", directory, quiet=quiet, gpus=gpus, arguments=arguments)


def _run(command: FastCommand) -> bool:
    """Carry the command out; False when the click tree must take it (a build with work)."""
    from gpuenv.cli.base import engine, up_to_date

    directory = os.path.abspath(command.directory)
    if command.name == "build":
        from gpuenv.images.build import up_to_date_tag

        try:
            known = up_to_date_tag(directory, command.bake, engine())
        except Exception:
            return False
        if not known:
            return False
        up_to_date(known, command.quiet)
        return True
    from gpuenv.cli.running import launch_run

    launch_run(
        directory,
        command.quiet,
        started=_collect_again,
        arguments=command.arguments,
        gpus=command.gpus,
        env=(),
        env_files=(),
        mounts=(),
        allow_mounts=(),
        root=False,
        wait=False,
        wait_timeout=None,
        memory=None,
        force=False,
        detach=False,
        name=None,
    )
    return True


def _collect_again() -> None:
    """Garbage collection back on for the rest of a run, sparing what starting it made
    (frozen: a collection never looks at it again)."""
    import gc

    gc.freeze()
    gc.enable()


def _exit(code: str | int | None, hard: bool) -> NoReturn:
    """Exit as `sys.exit(code)` does; `hard` (gpuenv's own process) ends it without the
    interpreter's teardown (20-40 ms of freeing memory the system frees anyway): every
    file, claim and container was closed where it was opened, gpuenv's threads are
    daemons (they would not outlive the teardown either), and the atexit handlers (the
    libraries' logging) still run; what is left is to flush the output."""
    if not hard:
        sys.exit(code)
    if code is None or isinstance(code, int):
        status = code or 0
    else:
        if sys.stderr is not None:
            print(code, file=sys.stderr)  # as sys.exit("message") does
        status = 1
    import atexit

    atexit._run_exitfuncs()  # what the teardown would run first
    for stream in (sys.stdout, sys.stderr):
        if stream is None:  # started with the descriptor closed (`>&-`)
            continue
        try:
            stream.flush()
        except BrokenPipeError:
            status = status or 141  # as base.exit_code_for says a closed pipe
        except (OSError, ValueError):
            pass
    os._exit(status)


def entry(argv: Sequence[str] | None = None) -> None:
    """The `gpuenv` command: the fast path when it can take the command line, else click."""
    command = parse(sys.argv[1:] if argv is None else argv)
    if command is not None:
        import gc
        import warnings

        # Starting a run allocates much (every import) and frees little: collections
        # then are wasted time (~15 ms). A run re-enables them once its container runs.
        gc.disable()
        from gpuenv.cli.base import debugging, exit_code_for, show_warning
        from gpuenv.errors import GpuenvWarning

        code: str | int | None  # None: the click tree takes the command line
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("default", GpuenvWarning)
                warnings.showwarning = show_warning
                done = _run(command)
            if sys.stdout is not None:
                sys.stdout.flush()  # a closed pipe shows here, not in the flush at exit
        except SystemExit as exc:
            code = 0 if exc.code is None else exc.code  # sys.exit(): 0, not to click
        except (Exception, KeyboardInterrupt) as exc:
            code = exit_code_for(exc, debugging())
        else:
            code = 0 if done else None
        finally:
            gc.enable()
        if code is not None:
            _exit(code, hard=argv is None)
    from gpuenv.cli.tree import main

    if argv is not None:
        main(list(argv))
        return
    try:
        main()  # click ends with SystemExit, whatever happened
    except SystemExit as exc:
        _exit(exc.code, hard=True)  # ~35 ms of teardown spared (resolve: click, yaml, matrix)
