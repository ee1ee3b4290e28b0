"""Pure consumers of the engine's pull and build event streams.

Views (`gpuenv.cli.live`) render their state; tests feed them lists of dicts. Docker's
event shapes: pull `{"status", "id", "progressDetail": {"current", "total"}}`; build, from
the classic builder `{"stream": "Step 2/7 : RUN ..."}` (buildah's: `STEP 2/7: ...`), from
BuildKit `{"id": "moby.buildkit.trace", "aux": "<base64 StatusResponse>"}` (`images.buildkit`);
`{"error": ...}` for all.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from gpuenv.engine.protocol import Event
from gpuenv.images import buildkit

# A step: Docker's classic builder `Step 2/7 : RUN ...`, buildah `[2/2] STEP 4/6: RUN ...`.
_STEP = re.compile(r"^(?:Step \d+/\d+ : |(?:\[\d+/\d+\] )?STEP \d+/\d+: )")
# The daemon colours a RUN step's stderr red with ANSI codes; logs and messages want text.
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_NOISE = ("Removing intermediate container", "---> Running in", "---> ", "--> ")
_LABEL = re.compile(r"^(?:\[[^\]]*\](?: STEP \d+/\d+)?|Step \d+/\d+|STEP \d+/\d+)")
_CACHED = ("---> Using cache", "--> Using cache")  # the classic builder's, buildah's
UNREADABLE = "BuildKit sent progress gpuenv cannot read"
WARNING = "gpuenv: warning: "  # how the install scripts warn (install.py)
_DIGEST = re.compile(r"^Digest: (sha256:[0-9a-f]{64})$")


@dataclass
class Layer:
    id: str
    status: str = "waiting"
    current: int = 0
    total: int = 0

    @property
    def done(self) -> bool:
        return self.status in ("Pull complete", "Already exists")


@dataclass
class PullProgress:
    """Per-layer state and totals of one pull."""

    layers: dict[str, Layer] = field(default_factory=dict)
    digest: str | None = None
    status: str = ""
    error: str | None = None

    def feed(self, event: Event) -> None:
        if "error" in event:
            self.error = str(event.get("error") or event.get("errorDetail", {}).get("message"))
            return
        status = str(event.get("status", ""))
        layer_id = event.get("id")
        match = _DIGEST.match(status)
        if match:
            self.digest = match.group(1)
        if layer_id and status not in ("Pulling from",) and not status.startswith("Pulling from"):
            layer = self.layers.setdefault(str(layer_id), Layer(str(layer_id)))
            layer.status = status
            detail = event.get("progressDetail") or {}
            if status == "Downloading":
                layer.current = int(detail.get("current") or 0)
                layer.total = int(detail.get("total") or layer.total)
            elif status in ("Download complete", "Pull complete") and layer.total:
                layer.current = layer.total
        elif not layer_id:
            self.status = status

    @property
    def downloaded(self) -> int:
        return sum(layer.current for layer in self.layers.values())

    @property
    def total(self) -> int:
        return sum(layer.total for layer in self.layers.values())

    @property
    def done_layers(self) -> int:
        return sum(1 for layer in self.layers.values() if layer.done)


@dataclass
class BuildStep:
    """One Dockerfile step of a build: its name, whether the builder reused its cached
    result, and how long it ran (None while it runs, or when the builder does not say)."""

    name: str
    cached: bool = False
    seconds: float | None = None
    started: bool = False  # BuildKit announces every step before it runs any
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=25), repr=False)

    @property
    def label(self) -> str:
        """The step's number as the builder writes it: `[stage-0 3/5]`, `Step 2/7`,
        `[2/2] STEP 4/6`."""
        match = _LABEL.match(self.name)
        return match.group(0).rstrip(" :") if match else self.name

    def line(self) -> str:
        """How a finished step is shown: its name, then `cached` or its time."""
        if self.cached:
            return f"{self.name} · cached"
        if self.seconds is not None:
            return f"{self.name} · {self.seconds:.1f}s"
        return self.name


@dataclass
class BuildProgress:
    """Every step seen, the one that failed, and the last lines of output: from the
    classic builder's `stream` lines, or from BuildKit's trace (`images.buildkit`),
    where steps can run side by side and each keeps its own lines."""

    steps: list[BuildStep] = field(default_factory=list)
    error: str | None = None
    failed: BuildStep | None = None
    warnings: list[str] = field(default_factory=list)  # said once, after the build
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)  # classic steps' times
    _started: float | None = field(default=None, repr=False)
    _vertexes: dict[str, BuildStep] = field(default_factory=dict, repr=False)
    _partial: dict[str, bytes] = field(default_factory=dict, repr=False)

    @property
    def current(self) -> BuildStep | None:
        """The failed step, else the last one that started."""
        started = [step for step in self.steps if step.started] or self.steps
        return self.failed or (started[-1] if started else None)

    @property
    def step(self) -> str | None:
        return self.current.name if self.current else None

    @property
    def tail(self) -> deque[str]:
        """The last lines of the failed step, else of the last one that started."""
        return self.current.tail if self.current else deque()

    @property
    def cached_steps(self) -> int:
        return sum(1 for step in self.steps if step.cached)

    def warn(self, text: str) -> None:
        if text not in self.warnings:
            self.warnings.append(text)

    def retry(self) -> None:
        """The build starts again (without caches): its steps follow those seen."""
        self._timed()
        self.error = None
        self.failed = None
        self._vertexes.clear()
        self._partial.clear()

    def _said(self, line: str) -> None:
        """A line of a step's output: gpuenv's own warnings are kept for the end."""
        if line.startswith(WARNING):
            self.warn(line.removeprefix(WARNING))

    def feed(self, event: Event) -> list[str]:
        """Update from one event; return the output lines it carried."""
        if "error" in event:
            detail = event.get("errorDetail") or {}
            self.error = str(event.get("error") or detail.get("message") or "build failed")
            return [self.error]
        if event.get("id") == buildkit.TRACE_ID:
            try:
                status = buildkit.decode(str(event.get("aux") or ""))
            except buildkit.TraceError as exc:  # the build goes on; only its progress is lost
                if not any(text.startswith(UNREADABLE) for text in self.warnings):
                    self.warn(f"{UNREADABLE} ({exc}): some of its lines are missing above")
                return []
            return self._trace(status)
        if self._vertexes:  # BuildKit's own `stream` lines ("Successfully tagged ...")
            return []
        return self._classic(str(event.get("stream", "")))

    def _classic(self, text: str) -> list[str]:
        """The classic builder's lines (`Step N/M : ...`, `---> Using cache`, output), and
        buildah's (`[1/2] STEP N/M: ...`, `--> Using cache ID`)."""
        lines = []
        for raw in text.splitlines():
            line = _ANSI.sub("", raw).rstrip()
            if not line:
                continue
            if _STEP.match(line):
                self._timed()
                self.steps.append(BuildStep(line, started=True))
                self._started = self.clock()
            elif line.strip().startswith(_CACHED) and self.steps:
                self.steps[-1].cached = True
            elif not line.strip().startswith(_NOISE) and self.steps:
                self.steps[-1].tail.append(line)
            self._said(line)
            lines.append(line)
        return lines

    def _timed(self) -> None:
        """The last classic step ran until now (the next one starts, or the build ends):
        those builders say when a step starts, not how long it took."""
        if self.steps and self._started is not None and not self.steps[-1].cached:
            self.steps[-1].seconds = self.clock() - self._started
        self._started = None

    def finish(self) -> None:
        """The build ended: the last classic step's time."""
        self._timed()

    def _trace(self, status: buildkit.Status) -> list[str]:
        """BuildKit's vertexes (the Dockerfile's steps among them: `[stage 2/5] RUN ...`)
        and their logs."""
        for vertex in status.vertexes:
            step = self._vertexes.get(vertex.digest)
            if step is None and _dockerfile_step(vertex.name):
                step = self._vertexes[vertex.digest] = BuildStep(vertex.name)
                self.steps.append(step)
            if step is None:
                continue
            step.cached = step.cached or vertex.cached
            step.started = step.started or vertex.started is not None or vertex.cached
            if vertex.started is not None and vertex.completed is not None:
                step.seconds = max(0.0, vertex.completed - vertex.started)
            if vertex.error:
                self.failed = step
                self.error = vertex.error
        lines = []
        for log in status.logs:
            text = self._partial.pop(log.vertex, b"") + log.data
            *complete, rest = text.split(b"\n")
            if rest:
                self._partial[log.vertex] = rest
            step = self._vertexes.get(log.vertex)
            for raw in complete:
                line = _ANSI.sub("", raw.decode("utf-8", errors="replace")).rstrip()
                if line:
                    self._said(line)
                    lines.append(line)
                    if step is not None:
                        step.tail.append(line)
        return lines


def is_step_line(line: str) -> bool:
    """A classic builder's (or buildah's) line that starts a step, not a step's output."""
    return bool(_STEP.match(line))


def _dockerfile_step(name: str) -> bool:
    """A vertex that is a step of the Dockerfile (`[2/5] RUN ...`, `[gpuenv-uv 2/2] ...`),
    not one of BuildKit's own (`[internal] load metadata ...`, `exporting to image`)."""
    return name.startswith("[") and not name.startswith("[internal]")


class PullView(Protocol):
    def pull_started(self, reference: str) -> None: ...
    def pull_event(self, progress: PullProgress) -> None: ...
    def pull_finished(self, progress: PullProgress) -> None: ...


class BuildView(Protocol):
    def build_started(self, tag: str) -> None: ...
    def build_lines(self, progress: BuildProgress, lines: list[str]) -> None: ...
    def build_finished(self, progress: BuildProgress) -> None: ...


class View(PullView, BuildView, Protocol):
    pass


ViewFactory = Callable[[], View]  # the view, made when a pull or build happens
