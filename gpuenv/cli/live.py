"""Progress views for pulls and builds: live (rich) on a terminal, plain lines otherwise,
nothing with --quiet. Pure consumers of `gpuenv.progress` state."""

from __future__ import annotations

from rich.console import Group
from rich.live import Live
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TransferSpeedColumn,
)
from rich.text import Text

from gpuenv.cli import ui
from gpuenv.cli.quiet import QuietView
from gpuenv.images.progress import BuildProgress, PullProgress, is_step_line


class PlainView(QuietView):
    """One line per layer state change and every build line: for logs and CI."""

    def __init__(self) -> None:
        self._states: dict[str, str] = {}
        self._shown_steps = 0

    def pull_started(self, reference: str) -> None:
        self._states = {}
        ui.step(f"pulling {reference}")

    def pull_event(self, progress: PullProgress) -> None:
        for layer in progress.layers.values():
            if layer.status in ("Downloading", "Extracting", "Waiting"):
                continue
            if self._states.get(layer.id) != layer.status:
                self._states[layer.id] = layer.status
                size = f" ({ui.size_text(layer.total)})" if layer.total else ""
                ui.info(f"  {layer.id}: {layer.status}{size}")

    def pull_finished(self, progress: PullProgress) -> None:
        if not progress.error and not progress.layers:
            ui.info(f"  {progress.status or 'already present'}")
        elif not progress.error:
            ui.info(
                f"  {progress.done_layers}/{len(progress.layers)} layers, "
                f"{ui.size_text(progress.total)} downloaded"
            )

    def build_started(self, tag: str) -> None:
        ui.step(f"building {tag}")
        self._shown_steps = 0

    def build_lines(self, progress: BuildProgress, lines: list[str]) -> None:
        """Each step once when it starts (`cached` when the builder reused it), then its
        output lines, indented."""
        for step in progress.steps[self._shown_steps :]:
            ui.info(step.line())
        self._shown_steps = len(progress.steps)
        for line in lines:
            if not is_step_line(line):  # shown above, as the step
                ui.info(f"  {line}")

    def build_finished(self, progress: BuildProgress) -> None:
        for text in progress.warnings:
            ui.warn(text)


class LiveView(QuietView):
    """Per-layer bars and a total for pulls; the current step and its last lines for builds."""

    def __init__(self) -> None:
        self._progress: Progress | None = None
        self._tasks: dict[str, TaskID] = {}
        self._total: TaskID | None = None
        self._live: Live | None = None
        self._printed_steps = 0

    def pull_started(self, reference: str) -> None:
        ui.step(f"pulling {reference}")
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            console=ui.err,
            transient=False,
        )
        self._tasks = {}
        self._total = self._progress.add_task("[bold]total[/]", total=None)
        self._progress.start()

    def pull_event(self, progress: PullProgress) -> None:
        if self._progress is None:
            return
        for layer in progress.layers.values():
            task = self._tasks.get(layer.id)
            if task is None:
                task = self._tasks[layer.id] = self._progress.add_task(layer.id, total=None)
            total = layer.total or None
            self._progress.update(
                task,
                completed=layer.current,
                total=total,
                description=f"{layer.id} {escape(layer.status.lower())}",
            )
        if self._total is not None:
            self._progress.update(
                self._total,
                completed=progress.downloaded,
                total=progress.total or None,
                description=f"[bold]total[/] {progress.done_layers}/{len(progress.layers)} layers",
            )

    def pull_finished(self, progress: PullProgress) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def build_started(self, tag: str) -> None:
        ui.step(f"building {tag}")
        self._printed_steps = 0
        self._live = Live(console=ui.err, transient=True, refresh_per_second=8)
        self._live.start()

    def _render(self, progress: BuildProgress) -> Group:
        lines = [
            Text(line, style="dim", overflow="ellipsis", no_wrap=True)
            for line in list(progress.tail)[-8:]
        ]
        head = Text(progress.step or "starting", style="bold")
        return Group(head, *lines)

    def build_lines(self, progress: BuildProgress, lines: list[str]) -> None:
        while self._printed_steps < len(progress.steps) - 1:
            ui.err.print(Text(progress.steps[self._printed_steps].line()))
            self._printed_steps += 1
        if self._live is not None:
            self._live.update(self._render(progress))

    def build_finished(self, progress: BuildProgress) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
        for step in progress.steps[self._printed_steps :]:
            ui.err.print(Text(step.line()))
        self._printed_steps = len(progress.steps)
        for text in progress.warnings:
            ui.warn(text)


def make_view(quiet: bool) -> QuietView:
    if quiet:
        return QuietView()
    return LiveView() if ui.err.is_terminal else PlainView()
