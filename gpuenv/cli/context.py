"""What every click command shares: the application object (click's obj, which makes the
engine client once), the lazily loaded command tree (whose
errors take the one error path in `base`, with JSON failures when --json asks), the
option groups; and, from `base`, the adapters the CLI plugs into the core (the engine,
the progress view)."""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click
from click.shell_completion import CompletionItem

from gpuenv.cli import output
from gpuenv.cli.base import (
    as_gpuenv_error,
    debugging,
    internal,
    print_traceback,
    report,
    show_warning,
    stdout_closed,
    streams_closed,
    view_factory,
)
from gpuenv.cli.failure import error_data, internal_data, interrupted_data, usage_data
from gpuenv.engine.connection import connect
from gpuenv.errors import (
    EXIT_BROKEN_PIPE,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    PASS_THROUGH_COMMANDS,
    GpuenvError,
    GpuenvWarning,
    UsageError,
    pass_through_code,
)
from gpuenv.lock.locked import Freshness

if TYPE_CHECKING:
    from gpuenv.engine.protocol import Engine

__all__ = ["Application", "LazyGroup", "apply", "report", "view_factory"]

F = TypeVar("F", bound=Callable[..., Any])

FRAMEWORK_CHOICE = click.Choice(["pytorch", "tensorflow", "jax", "none"])


@dataclass
class Application:
    """The one application object of a `gpuenv` process, passed down the commands as
    click's `obj`: where the project is, --debug, and the engine client, made once, when
    a command first asks for it (every later ask, a dashboard's refreshes included, gets
    the same client). Tests give one with a fake engine: `main(args, obj=Application(
    connected=FakeEngine()))`."""

    directory: str = "."
    debug: bool = False
    # Where the command was started, relative to `directory`, when gpuenv.yaml was found
    # in a folder above it ("src/models"); "" otherwise. A run starts there in /workspace.
    subfolder: str = ""
    connected: Engine | None = None

    def engine(self) -> Engine:
        """The engine the environment names (DOCKER_HOST, CONTAINER_HOST, GPUENV_ENGINE),
        connected on first use; one that cannot be reached is asked again next time."""
        if self.connected is None:
            self.connected = connect()
        return self.connected


def _debug(ctx: click.Context) -> bool:
    obj = ctx.find_object(Application)
    return debugging(bool(obj and obj.debug))


def _leaf(group: click.Group, ctx: click.Context, words: Sequence[str]) -> click.Command | None:
    """The command the words name (`matrix sync` → sync), for the error path."""
    command: click.Command = group
    for word in words:
        if not isinstance(command, click.Group) or word.startswith("-"):
            break
        sub = command.get_command(ctx, word)
        if sub is None:
            break
        command = sub
    return None if command is group else command


def json_requested(group: click.Group, ctx: click.Context, args: Sequence[str]) -> bool:
    """Whether the command line asks for JSON: `--json` before any `--`, given to a
    command that has a --json option (never the `--json` of a command `gpuenv run`
    runs). Any command with such an option gets JSON failures for free."""
    words = list(args[: args.index("--")] if "--" in args else args)
    if "--json" not in words:
        return False
    try:
        leaf = _leaf(group, ctx, words)
    except Exception:  # a command module that does not import: no JSON, the error stands
        return False
    return leaf is not None and any("--json" in getattr(p, "opts", ()) for p in leaf.params)


class LazyGroup(click.Group):
    """A command group whose commands are imported when first used (click's documented
    LazyGroup): `gpuenv run` loads the run commands only. The one error path: every
    gpuenv error, an unreadable file, a closed pipe becomes one message and its exit
    code (and, with --json, one JSON object on stdout); tracebacks only with --debug."""

    def __init__(
        self, *args: Any, lazy_subcommands: Mapping[str, str] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_subcommands = dict(lazy_subcommands or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lazy_subcommands])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self.lazy_subcommands.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module, _, name = target.rpartition(".")
        command = getattr(importlib.import_module(module), name)
        if not isinstance(command, click.Command):  # pragma: no cover - a wiring mistake
            raise TypeError(f"{target} is not a click command")
        return command

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        original = list(args)  # click's parser consumes the list it is given
        try:
            rest = super().parse_args(ctx, args)
        except BrokenPipeError:  # `gpuenv --help | head -1`
            stdout_closed()
            ctx.exit(EXIT_BROKEN_PIPE)
        except click.UsageError as exc:  # gpuenv's own options (-C): JSON too, if asked
            named = [i for i, word in enumerate(original) if word in self.lazy_subcommands]
            if named and json_requested(self, ctx, original[named[0] :]):
                output.data(usage_data(exc), once=True)
            _show(ctx, exc)
        # The command's words: its name (just before the rest) and its arguments.
        ctx.meta["gpuenv.args"] = original[max(0, len(original) - len(rest) - 1) :]
        return rest

    def _fail(self, ctx: click.Context, exc: GpuenvError) -> NoReturn:
        code = self._own_code(ctx, exc.exit_code, exc)
        if self._json(ctx):
            output.data(error_data(exc, code), once=True)
        report(exc)
        if code != exc.exit_code:
            _said_own(exc.exit_code, code)
        if _debug(ctx):
            print_traceback()
        ctx.exit(code)

    @staticmethod
    def _passes_through(ctx: click.Context) -> bool:
        """Whether the command exits with its container command's code (`run`, `shell`,
        `wait`, `attach`): its own failures then exit 125-127, as docker run's."""
        words: list[str] = list(ctx.meta.get("gpuenv.args") or ())
        return bool(words) and words[0] in PASS_THROUGH_COMMANDS

    def _own_code(self, ctx: click.Context, code: int, exc: GpuenvError | None) -> int:
        return pass_through_code(exc) if self._passes_through(ctx) else code

    def _json(self, ctx: click.Context) -> bool:
        return json_requested(self, ctx, ctx.meta.get("gpuenv.args", ()))

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return self._invoke(ctx)
        except BrokenPipeError:  # met while saying why it failed: stderr is gone too
            streams_closed()
            ctx.exit(EXIT_BROKEN_PIPE)

    def _invoke(self, ctx: click.Context) -> Any:
        output.reset()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("default", GpuenvWarning)
                warnings.showwarning = show_warning
                result = super().invoke(ctx)
            sys.stdout.flush()  # a closed pipe shows here, not in the flush at exit
            return result
        except GpuenvError as exc:
            self._fail(ctx, exc)
        except BrokenPipeError:
            stdout_closed()
            ctx.exit(EXIT_BROKEN_PIPE)
        except KeyboardInterrupt:
            if self._json(ctx):
                output.data(interrupted_data(), once=True)
            click.echo("interrupted", err=True)
            ctx.exit(EXIT_INTERRUPTED)
        except (click.exceptions.Exit, click.exceptions.Abort):
            raise
        except click.ClickException as exc:  # a usage error: click prints it (stderr)
            exc.exit_code = self._own_code(ctx, exc.exit_code, None)  # type: ignore[misc]
            if self._json(ctx):
                output.data(usage_data(exc), once=True)
            _show(ctx, exc)
        except OSError as exc:  # permissions, a full disk, a read-only folder
            error = as_gpuenv_error(exc)
            if error is None:
                self._internal(ctx, exc)
            self._fail(ctx, error)
        except Exception as exc:
            self._internal(ctx, exc)

    def _internal(self, ctx: click.Context, exc: Exception) -> NoReturn:
        code = self._own_code(ctx, EXIT_INTERNAL, None)
        if self._json(ctx):
            output.data(internal_data(exc, code), once=True)
        internal(exc, _debug(ctx))
        ctx.exit(code)


def _show(ctx: click.Context, exc: click.ClickException) -> NoReturn:
    """A usage error said as click says it, and its exit code; 141 where stderr is a
    closed pipe (click itself would exit 1)."""
    try:
        exc.show()
    except BrokenPipeError:
        streams_closed()
        ctx.exit(EXIT_BROKEN_PIPE)
    ctx.exit(exc.exit_code)


def _said_own(reason: int, code: int) -> None:
    from gpuenv.errors import EXIT_CODES

    meaning = next((e.meaning for e in EXIT_CODES if e.code == reason), "")
    sys.stderr.write(f"gpuenv failed, not the command: exit {code} (reason {reason}: {meaning})\n")


def _complete_gpu_models(
    _ctx: click.Context, _param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """The GPU models the matrix knows, for `--gpu <TAB>` (`A1` -> A100, A10, ...)."""
    from gpuenv.app.resolve import gpu_model_names  # only when completing

    try:
        names = gpu_model_names()
    except GpuenvError:
        return []
    wanted = incomplete.lower()
    return [CompletionItem(name) for name in names if name.lower().startswith(wanted)]


def apply(options: Sequence[Callable[[F], F]]) -> Callable[[F], F]:
    """Several click options as one decorator, in the order listed."""

    def decorate(func: F) -> F:
        for option in reversed(options):
            func = option(func)
        return func

    return decorate


host_options = apply(
    [
        click.option(
            "--driver",
            metavar="VERSION",
            help="Plan for a host with this NVIDIA driver, e.g. 535.104.05.",
        ),
        click.option(
            "--gpu",
            "gpu_models",
            multiple=True,
            metavar="MODEL",
            shell_complete=_complete_gpu_models,
            help="Plan for a host with this GPU (repeat per GPU), e.g. 'A100' or 'RTX 4090'.",
        ),
        click.option(
            "--platform",
            type=click.Choice(["linux/amd64", "linux/arm64"]),
            help="Plan for a host of this platform (default: this machine's, unknown for a "
            "host described with --driver/--gpu).",
        ),
    ]
)

spec_options = apply(
    [
        click.option("--framework", type=FRAMEWORK_CHOICE, help="Framework to resolve."),
        click.option(
            "--version",
            metavar="SPEC",
            help="Framework version constraint (PEP 440), e.g. '2.4' or '>=2.1,<2.5'.",
        ),
        click.option(
            "--python", metavar="SPEC", help="Python constraint, e.g. '3.10' (3.10.*) or '>=3.10'."
        ),
        click.option(
            "--cuda", metavar="SPEC", help="CUDA toolkit constraint, e.g. '>=12.4' or '12.4'."
        ),
    ]
)


def json_option(what: str) -> Callable[[F], F]:
    """`--json`: print WHAT as one JSON object on stdout (the schema of each command
    is gpuenv/schemas/COMMAND.json); a failure is one JSON object too (error.json)."""
    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        help=f"Print {what} as one JSON object on stdout, a failure too "
        "(docs: reference/scripting).",
    )


quiet_option = click.option("--quiet", "-q", is_flag=True, help="No progress output, only errors.")
freshness_options = apply(
    [
        click.option(
            "--locked",
            is_flag=True,
            help="Refuse (exit 5) when gpuenv.lock's Python packages are older than the "
            "requirements, instead of resolving them again (for CI).",
        ),
        click.option(
            "--frozen",
            is_flag=True,
            help="Install gpuenv.lock's Python packages as they are, even if the "
            "requirements changed since.",
        ),
    ]
)


def freshness(locked: bool, frozen: bool) -> Freshness:
    """--locked / --frozen as the lock's freshness policy (default: re-resolve)."""
    if locked and frozen:
        raise UsageError("--locked and --frozen cannot be combined")
    return "locked" if locked else "frozen" if frozen else "update"


bake_option = click.option(
    "--bake",
    is_flag=True,
    help="Copy the project into the image (/workspace), for images that travel to a "
    "cluster; .dockerignore applies, as in docker build.",
)
bake_checks = apply(
    [
        click.option(
            "--allow-secret",
            "allow_secrets",
            multiple=True,
            metavar="PATTERN",
            help="Bake files matching PATTERN (.dockerignore syntax) although they look "
            "like credentials (.aws/, .ssh/, *.pem, *.key, .env, ...); repeatable.",
        ),
        click.option(
            "--allow-large",
            is_flag=True,
            help="Bake the project even if it is over 2 GiB.",
        ),
    ]
)
