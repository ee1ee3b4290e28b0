"""gpuenv matrix: the compatibility data gpuenv resolves against, and `matrix sync`."""

from __future__ import annotations

from typing import Any

import click
from click.shell_completion import CompletionItem

from gpuenv.app.matrix import SyncSource, matrix_view, sync_matrix
from gpuenv.cli import ui
from gpuenv.cli.matrix_view import show_matrix, show_sync
from gpuenv.engine.connection import registry_client
from gpuenv.project.spec import FAMILIES

TABLES = ("pytorch", "tensorflow", "jax", "none", "cuda", "gpus")


class _TableOrCommand(click.Group):
    """`gpuenv matrix [TABLE]` shows a table, `gpuenv matrix sync` is a subcommand: the
    first word that is not an option is taken as the TABLE when it names one."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        words = [arg for arg in args if not arg.startswith("-")]
        if words and words[0] in TABLES:
            args = list(args)
            args.remove(words[0])
            ctx.meta["gpuenv.matrix.table"] = words[0]
        return super().parse_args(ctx, args)

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[CompletionItem]:
        """The tables as well as `sync`: `gpuenv matrix py<TAB>` completes pytorch."""
        tables = [CompletionItem(name) for name in TABLES if name.startswith(incomplete)]
        return [*tables, *super().shell_complete(ctx, incomplete)]


@click.group(
    cls=_TableOrCommand,
    invoke_without_command=True,
    subcommand_metavar=f"[{'|'.join(TABLES)}] | sync [REPOSITORY]...",
)
@click.option(
    "--base",
    type=click.Choice(FAMILIES),
    default="ngc",
    show_default=True,
    help="Which images a framework table lists: NGC's, or Docker Hub's official ones.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the table as JSON.")
@click.pass_context
def matrix(ctx: click.Context, base: str, as_json: bool) -> None:
    """Show the compatibility matrix gpuenv resolves against.

    \b
    gpuenv matrix             what the matrix holds, and where its rows came from
    gpuenv matrix pytorch     NGC PyTorch images (also tensorflow, jax, none)
    gpuenv matrix tensorflow --base dockerhub
                              Docker Hub's official TensorFlow GPU images
    gpuenv matrix cuda        CUDA toolkits, driver floors, compute capabilities
    gpuenv matrix gpus        GPU models, compute capability and class
    gpuenv matrix sync        add what NGC images say about themselves (registry)
    """
    if ctx.invoked_subcommand is not None:
        return

    table = ctx.meta.get("gpuenv.matrix.table")
    show_matrix(matrix_view(table, base), table, as_json)


@matrix.command()
@click.argument("repositories", nargs=-1, metavar="[REPOSITORY]...")
@click.option(
    "--registry",
    metavar="HOST[:PORT]",
    help="Read this registry (a mirror of nvcr.io) instead of GPUENV_REGISTRY_MIRROR or nvcr.io.",
)
@click.option("--json", "as_json", is_flag=True, help="Print what was found as one JSON object.")
def sync(repositories: tuple[str, ...], registry: str | None, as_json: bool) -> None:
    """Derive matrix rows from NGC images' own metadata, into your overlay.

    Reads each tag's manifest (or index) and config from the registry, never a layer.
    New tags are added (evidence "image"), unknown fields of shipped rows are filled, and
    where an image contradicts the shipped matrix the matrix value is kept and the
    disagreement reported. REPOSITORY: e.g. pytorch or nvidia/pytorch (default: all).

    \b
    Examples:
      gpuenv matrix sync
      gpuenv matrix sync pytorch --registry mirror.example:5000 --json
    """
    try:
        source = SyncSource.for_registry(registry)
    except ValueError as exc:  # InvalidMirror: --registry's, or the configured mirror's
        raise click.BadParameter(str(exc), param_hint="--registry") from None
    synced = sync_matrix(
        source,
        lambda at: registry_client(at.host, at.credentials, scheme=at.scheme),
        repositories,
        progress=_progress(ui),
        step=ui.step,
        warn=ui.warn,
    )
    show_sync(synced.report, synced.path, as_json)


def _progress(ui: Any) -> Any:
    """Progress on stderr: a line for a repository's first tag, every 50th and its last."""

    def progress(done: int, total: int, image: str) -> None:
        if done == 1 or done == total or done % 50 == 0:
            ui.info(f"  [{done}/{total}] {image}")

    return progress
