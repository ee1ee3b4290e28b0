"""The files of a build context: what `--bake` copies from the project, chosen with
Docker's .dockerignore rules (gpuenv.images.dockerignore)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gpuenv.errors import BuildError
from gpuenv.images.dockerignore import BadPattern, PatternMatcher, read_ignore_file

# Never worth baking, left out before the project's .dockerignore is read (so a
# `!pattern` there can still bring one back): version control, environments, caches.
DEFAULT_EXCLUDES = (
    "**/.git",
    "**/.hg",
    "**/.svn",
    "**/.venv",
    "**/venv",
    "**/__pycache__",
    "**/*.pyc",
    "**/.mypy_cache",
    "**/.pytest_cache",
    "**/.ruff_cache",
    "**/.ipynb_checkpoints",
)
# gpuenv's own, left out after it (never re-included): the lock records pushes of the
# baked image (so it would change that image's tag), and .gpuenv/ holds Slurm scripts,
# job output and logs.
FORCED_EXCLUDES = ("gpuenv.lock", ".gpuenv")


@dataclass(frozen=True)
class ContextFile:
    """A file of the build context: its name in the archive and where its bytes are."""

    name: str
    path: str | None = None
    data: bytes | None = None
    executable: bool = False
    link: str | None = None
    origin: str | None = None  # the project file `data` was made from (it decides rebuilds)
    size: int = 0

    def content(self) -> bytes:
        if self.data is not None:
            return self.data
        if self.link is not None:
            return self.link.encode()
        assert self.path is not None
        return Path(self.path).read_bytes()


def ignore_matcher(project_dir: str) -> PatternMatcher:
    """gpuenv's defaults, then the project's .dockerignore, then gpuenv's own files."""
    patterns = list(DEFAULT_EXCLUDES)
    ignore_file = os.path.join(project_dir, ".dockerignore")
    if os.path.isfile(ignore_file):
        with open(ignore_file, encoding="utf-8", errors="replace") as handle:
            patterns += read_ignore_file(handle.read())
    patterns += FORCED_EXCLUDES
    try:
        return PatternMatcher(patterns)
    except BadPattern as exc:
        raise BuildError(
            f".dockerignore: {exc}",
            hint="fix the pattern (Docker's syntax: * ? [a-z] ** and !pattern)",
        ) from None


def project_files(project_dir: str) -> list[ContextFile]:
    """The project's files for `--bake`: every file Docker's .dockerignore rules keep
    (a later `!pattern` re-includes), symlinks as links (never followed)."""
    matcher = ignore_matcher(project_dir)
    out: list[ContextFile] = []

    def walk(folder: str, relative: str, parent: list[bool] | None) -> None:
        with os.scandir(folder) as entries:
            listed = sorted(entries, key=lambda e: e.name)
        for entry in listed:
            name = f"{relative}/{entry.name}" if relative else entry.name
            excluded, matched = matcher.matches(name, parent)
            is_folder = entry.is_dir(follow_symlinks=False)
            if is_folder:
                if not excluded or matcher.may_include_below(name):
                    walk(entry.path, name, matched)
                continue
            if excluded:
                continue
            if entry.is_symlink():
                out.append(ContextFile(f"project/{name}", link=os.readlink(entry.path)))
            elif entry.is_file(follow_symlinks=False):
                out.append(
                    ContextFile(
                        f"project/{name}",
                        path=entry.path,
                        executable=os.access(entry.path, os.X_OK),
                        size=entry.stat(follow_symlinks=False).st_size,
                    )
                )

    walk(project_dir, "", None)
    return sorted(out, key=lambda f: f.name)
