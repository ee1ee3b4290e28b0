"""Pure consumers of the engine's pull and build event streams.

Views (`gpuenv.live`) render their state; tests feed them lists of dicts. Docker's
event shapes: pull `{"status", "id", "progressDetail": {"current", "total"}}`, build
`{"stream": "Step 2/7 : RUN ..."}`, `{"aux": {"ID": ...}}`, and `{"error": ...}` for both.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

from gpuenv.engine.protocol import Event

_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
# The daemon colours a RUN step's stderr red with ANSI codes; logs and messages want text.
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_NOISE = ("Removing intermediate container", "---> Running in", "---> ")
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
class BuildProgress:
    """The current step, every step seen, and the last lines of output."""

    steps: list[str] = field(default_factory=list)
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=25))
    error: str | None = None
    cached_steps: int = 0

    @property
    def step(self) -> str | None:
        return self.steps[-1] if self.steps else None

    def feed(self, event: Event) -> list[str]:
        """Update from one event; return the output lines it carried."""
        if "error" in event:
            detail = event.get("errorDetail") or {}
            self.error = str(event.get("error") or detail.get("message") or "build failed")
            return [self.error]
        lines = []
        for raw in str(event.get("stream", "")).splitlines():
            line = _ANSI.sub("", raw).rstrip()
            if not line:
                continue
            if _STEP.match(line):
                self.steps.append(line)
                self.tail.clear()
            elif line.strip() == "---> Using cache":
                self.cached_steps += 1
            elif not line.strip().startswith(_NOISE):
                self.tail.append(line)
            lines.append(line)
        return lines
