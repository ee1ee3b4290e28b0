"""`gpuenv export devcontainer` and the command its file runs, `gpuenv devcontainer-claim`:
an editor in the locked environment (`gpuenv.app.devcontainer`)."""

from __future__ import annotations

import os

import click

from gpuenv.app.devcontainer import claim_for_devcontainer, export_devcontainer
from gpuenv.app.launch import host_services
from gpuenv.cli import ui
from gpuenv.cli.base import say, view_factory
from gpuenv.cli.context import Application, quiet_option


@click.command("devcontainer")
@click.option(
    "--gpus",
    metavar="SPEC",
    help="The GPUs to write in, as for `gpuenv run --gpus` (default: the spec's), "
    "chosen now among the free ones.",
)
@click.option("--force", is_flag=True, help="Replace a devcontainer.json gpuenv did not write.")
@quiet_option
@click.pass_obj
def export_devcontainer_command(
    obj: Application, gpus: str | None, force: bool, quiet: bool
) -> None:
    """Write .devcontainer/devcontainer.json: the project's locked environment for VS
    Code's Dev Containers and the `devcontainer` CLI.

    The file is yours on this host: the image gpuenv built from gpuenv.lock (with your
    account in it; built now if missing), the project at /workspace, you as the user,
    the spec's (or --gpus) GPUs by UUID, chosen now among the free ones, shared memory
    and ulimits as `gpuenv run` sets them, the spec's ports to forward.

    Opening it runs `gpuenv devcontainer-claim` first (the file's initializeCommand):
    it claims those GPUs like a run's while the container runs, so `gpuenv ps` and
    `top` show it and no run lands on them; when someone holds them, the editor is
    refused with their name. Export again after `gpuenv lock` (`gpuenv check` and
    `lock --check` say when the file is stale) and on another server.

    \b
    Examples:
      gpuenv export devcontainer
      gpuenv export devcontainer --gpus 2
      devcontainer up --workspace-folder .
    """
    exported = export_devcontainer(
        obj.directory,
        obj.engine(),
        services=host_services(),
        environ=os.environ,
        view=view_factory(quiet),
        notice=lambda text: None if quiet else ui.warn(text),
        uid=os.getuid(),
        gpus=gpus,
        force=force,
    )
    editor = exported.editor
    ui.success(f"wrote {os.path.relpath(exported.path)}")
    if quiet:
        return
    gpus_said = ", ".join(editor.gpus) or editor.grant
    ui.info(f"image {editor.image}; container {editor.name}; GPUs: {gpus_said}")
    ui.info(
        "open the folder in VS Code and choose “Reopen in Container”, or run "
        "`devcontainer up --workspace-folder .`"
    )


@click.command("devcontainer-claim", hidden=True)
@quiet_option
@click.pass_obj
def devcontainer_claim(obj: Application, quiet: bool) -> None:
    """Claim the GPUs .devcontainer/devcontainer.json names, held while its container
    runs (the file's initializeCommand runs this before the editor starts it)."""
    claimed = claim_for_devcontainer(
        obj.directory,
        obj.engine(),
        services=host_services(),
        view=view_factory(quiet),
        notice=lambda text: None if quiet else say(f"gpuenv: {text}"),
        uid=os.getuid(),
    )
    if quiet:
        return
    if not claimed.gpus:
        say(f"gpuenv: {claimed.container} has no GPUs to claim")
    elif claimed.already:
        say(f"gpuenv: GPUs {', '.join(claimed.gpus)} are held for {claimed.container} already")
    else:
        say(
            f"gpuenv: claimed GPUs {', '.join(claimed.gpus)} for {claimed.container}, "
            "held while it runs"
        )
