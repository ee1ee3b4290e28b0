"""The view of a quiet pull or build (`-q`): nothing shown, and rich never loaded."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: `gpuenv --version` loads none of the core
    from gpuenv.images.progress import BuildProgress, PullProgress


class QuietView:
    """The view of a quiet pull or build: nothing shown (and rich never loaded)."""

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
        pass
