"""Progress views for pulls and builds: live (rich) on a terminal, plain lines otherwise,
nothing with --quiet. Pure consumers of `gpuenv.progress` state."""

from __future__ import annotations

from rich.console import Group
from rich.live import Live
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
from gpuenv.cli.ui import cell
from gpuenv.common.text import visible
from gpuenv.images.progress import BuildProgress, PullProgress, is_step_line


class PlainView(QuietView):
    """One line per layer state change and every build line: for logs and CI."""

    def __init__(self) -> None:
        self._states: dict[str, str] = {}
        self._headed: set[int] = set()
        self._closed: set[int] = set()

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
        self._headed = set()
        self._closed = set()

    def build_lines(self, progress: BuildProgress, lines: list[str]) -> None:
        """Each step when it starts (`· cached` when the builder reused it), its output
        lines indented, and its time when it is done."""
        for index, step in enumerate(progress.steps):
            if step.started and index not in self._headed:
                self._headed.add(index)
                ui.info(step.line() if step.cached else step.name)
                if step.cached:
                    self._closed.add(index)
        for line in lines:
            if not is_step_line(line):  # shown above, as the step
                ui.info(f"  {line}")
        self._close(progress)

    def _close(self, progress: BuildProgress) -> None:
        for index, step in enumerate(progress.steps):
            done = step.cached or step.seconds is not None
            if done and index in self._headed and index not in self._closed:
                self._closed.add(index)
                ui.info(
                    f"{step.label} {'cached' if step.cached else f'done in {step.seconds:.1f}s'}"
                )

    def build_finished(self, progress: BuildProgress) -> None:
        self._close(progress)
        for text in progress.warnings:
            ui.warn(text)


class LiveView(QuietView):
    """Per-layer bars and a total for pulls; the current step and its last lines for builds."""

    def __init__(self) -> None:
        self._progress: Progress | None = None
        self._tasks: dict[str, TaskID] = {}
        self._total: TaskID | None = None
        self._live: Live | None = None
        self._printed: set[int] = set()

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
                description=f"{cell(layer.id)} {cell(layer.status.lower())}",
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
        self._printed = set()
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
        """Each step once it is done (cached, or with its time), above the live area."""
        for index, step in enumerate(progress.steps):
            if index not in self._printed and (step.cached or step.seconds is not None):
                self._printed.add(index)
                ui.err.print(Text(visible(step.line(), lines=True)))
        if self._live is not None:
            self._live.update(self._render(progress))

    def build_finished(self, progress: BuildProgress) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
        for index, step in enumerate(progress.steps):  # the failed one, and the rest started
            if index not in self._printed and step.started:
                self._printed.add(index)
                ui.err.print(Text(visible(step.line(), lines=True)))
        for text in progress.warnings:
            ui.warn(text)


def make_view(quiet: bool) -> QuietView:
    if quiet:
        return QuietView()
    return LiveView() if ui.err.is_terminal else PlainView()
