"""What every command shares: the context, the one error path (`abort`), the lazily
loaded command tree, the option groups, and the adapters the CLI plugs into the core
(the engine, the progress view)."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import click

from gpuenv.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, GpuenvError

if TYPE_CHECKING:
    from gpuenv.engine.protocol import Engine
    from gpuenv.images.service import View

F = TypeVar("F", bound=Callable[..., Any])

FRAMEWORK_CHOICE = click.Choice(["pytorch", "tensorflow", "jax", "none"])


class Context(NamedTuple):
    directory: str
    debug: bool


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


def _debug(ctx: click.Context) -> bool:
    obj = ctx.find_object(Context)
    return bool(obj and obj.debug) or os.environ.get("GPUENV_DEBUG") == "1"


def _traceback() -> None:
    import traceback

    traceback.print_exc()


class LazyGroup(click.Group):
    """A command group whose commands are imported when first used (click's documented
    LazyGroup): `gpuenv run` loads the run commands only. Every gpuenv error becomes one
    message and its exit code; tracebacks only with --debug."""

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

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except GpuenvError as exc:
            report(exc)
            if _debug(ctx):
                _traceback()
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(EXIT_INTERRUPTED)
        except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort):
            raise
        except Exception as exc:
            if _debug(ctx):
                _traceback()
            click.echo(
                f"error: internal error: {type(exc).__name__}: {exc}\n"
                "hint: this is a bug in gpuenv; run again with --debug and report the traceback",
                err=True,
            )
            ctx.exit(EXIT_INTERNAL)


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

quiet_option = click.option("--quiet", "-q", is_flag=True, help="No progress output, only errors.")
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
