"""gpuenv resolve: the image for the spec on this host, or a described one. Its own
module: scripts call it often (`IMAGE=$(gpuenv resolve)`, `--json`), and it loads only
what resolving needs; the rich tables of its human output are loaded when shown."""

from __future__ import annotations

import click

from gpuenv.app.own_base import engine_reader
from gpuenv.app.resolve import resolve_spec
from gpuenv.cli import output
from gpuenv.cli.base import view_factory
from gpuenv.cli.context import Application, host_options, json_option, spec_options
from gpuenv.errors import ResolutionError
from gpuenv.project.overrides import Overrides
from gpuenv.resolution.hostplan import HostPlan


@click.command()
@spec_options
@host_options
@click.option("--explain", is_flag=True, help="Show every candidate image and why it fits or not.")
@click.option(
    "--newest",
    is_flag=True,
    help="The newest image that fits, even where the matrix does not record its framework "
    "version or it runs only by a disputed forward compatibility (by default such images "
    "are named, not chosen).",
)
@click.option(
    "--strict-driver",
    is_flag=True,
    help="Only images whose CUDA toolkit's own driver the host has (native), as the spec's "
    "`strict_driver: true` asks: no CUDA minor-version compatibility, no forward "
    "compatibility.",
)
@json_option("the resolution")
@click.pass_obj
def resolve(
    obj: Application,
    framework: str | None,
    version: str | None,
    python: str | None,
    cuda: str | None,
    driver: str | None,
    gpu_models: tuple[str, ...],
    platform: str | None,
    explain: bool,
    newest: bool,
    strict_driver: bool,
    as_json: bool,
) -> None:
    """Choose the image for the spec on this host (or a described one).

    Uses gpuenv.yaml when present; flags override its fields, and with --framework
    no spec file is needed. The project's dependency files steer it as they steer
    `gpuenv lock` (torch==2.1.2 takes a PyTorch 2.1 image), and a file `check` refuses
    is refused here too. Prints the image reference; details go to stderr.
    Nothing is written: `gpuenv lock` pins the result. Where gpuenv.lock pins another
    image, a warning says so. A data-center GPU below an image's minimum driver runs it
    by forward compatibility only on a branch NVIDIA supports; where NVIDIA's documents
    disagree the route says "unverified" (`route_verified: false` in --json).

    \b
    Examples:
      gpuenv resolve --explain
      gpuenv resolve --framework pytorch --version 2.4 --driver 535.104.05 --gpu 'RTX 4090'
      gpuenv resolve --json | jq -r .image
    """
    try:
        answer = resolve_spec(
            obj.directory,
            Overrides(framework, version, python, cuda),
            HostPlan(driver, gpu_models, platform),
            strict_driver=strict_driver,
            newest=newest,
            read_base=engine_reader(obj.engine, view_factory(as_json)),
        )
    except ResolutionError as exc:
        if explain and exc.host is not None:
            from gpuenv.cli.views import explain_table  # rich: only to show the table

            explain_table(exc.candidates, None, exc.host)
        raise exc from None
    resolution = answer.resolution
    if as_json:
        # Warnings are in the object (`warnings`); stdout carries nothing else.
        payload = resolution.to_data()
        payload["matrix_version"] = answer.matrix_version
        output.data(payload)
        return

    from gpuenv.cli.views import explain_table, show_resolution  # rich: not for --json

    if explain:
        explain_table(resolution.candidates, resolution.candidate, answer.host)
    output.result(resolution.row.image)
    show_resolution(resolution)
