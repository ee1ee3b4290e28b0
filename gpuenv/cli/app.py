"""What every click command shares: the context, the lazily loaded command tree (whose
errors take the one error path in `base`), the option groups; and, from `base`, the
adapters the CLI plugs into the core (the engine, the progress view)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

import click

from gpuenv.cli.base import debugging, engine, exit_code_for, report, view_factory

__all__ = ["Context", "LazyGroup", "apply", "engine", "report", "view_factory"]

F = TypeVar("F", bound=Callable[..., Any])

FRAMEWORK_CHOICE = click.Choice(["pytorch", "tensorflow", "jax", "none"])


class Context(NamedTuple):
    directory: str
    debug: bool


def _debug(ctx: click.Context) -> bool:
    obj = ctx.find_object(Context)
    return debugging(bool(obj and obj.debug))


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
        except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort):
            raise
        except (Exception, KeyboardInterrupt) as exc:
            ctx.exit(exit_code_for(exc, _debug(ctx)))


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
    help="Copy the project into the image (/workspace), for images that travel to a cluster.",
)
