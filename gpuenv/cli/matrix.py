"""gpuenv matrix: the compatibility data gpuenv resolves against."""

from __future__ import annotations

import click


@click.command()
@click.argument(
    "table",
    required=False,
    type=click.Choice(["pytorch", "tensorflow", "jax", "none", "cuda", "gpus"]),
)
@click.option("--json", "as_json", is_flag=True, help="Print the table as JSON.")
def matrix(table: str | None, as_json: bool) -> None:
    """Show the compatibility matrix gpuenv resolves against.

    \b
    gpuenv matrix             what the matrix holds
    gpuenv matrix pytorch     NGC PyTorch images (also tensorflow, jax, none)
    gpuenv matrix cuda        CUDA toolkits, driver floors, compute capabilities
    gpuenv matrix gpus        GPU models, compute capability and class
    """
    from gpuenv.cli.matrix_view import show_matrix
    from gpuenv.resolution.matrix import load_matrix

    show_matrix(load_matrix(), table, as_json)
