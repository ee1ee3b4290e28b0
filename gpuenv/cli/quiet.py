"""The view of a quiet pull or build (`-q`): no progress shown, and rich never loaded."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: `gpuenv --version` loads none of the core
    from gpuenv.images.progress import BuildProgress, PullProgress


class QuietView:
    """The view of a quiet pull or build: no progress, only warnings (and rich never loaded)."""

    def pull_started(self, reference: str) -> None:
        pass

    def pull_event(self, progress: PullProgress) -> None:
        pass

    def pull_finished(self, progress: PullProgress) -> None:
        pass

    def build_started(self, tag: str) -> None:
        pass

    def build_lines(self, progress: BuildProgress, lines: list[str]) -> None:
        pass

    def build_finished(self, progress: BuildProgress) -> None:
        """Warnings are said even when quiet (on stderr, plainly: rich is not loaded)."""
        for text in progress.warnings:
            sys.stderr.write(f"warning: {text}\n")
