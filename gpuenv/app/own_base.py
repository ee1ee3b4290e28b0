"""A base of the team's own (`base:` naming an image) as the resolver sees it: a matrix
row read from the image (`gpuenv.matrix.own`), added to the matrix for one resolution.

`gpuenv lock` reads the image where it has not read it before (a new lock, another
`base:`, `--upgrade`, which may find the tag moved); otherwise the row the lock
recorded is used, so a re-lock after an unrelated edit needs no engine and no registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from gpuenv.engine.protocol import Engine
from gpuenv.errors import EngineError
from gpuenv.images.progress import PullView
from gpuenv.lock.lockfile import Lock, own_row_from_lock
from gpuenv.matrix.model import ImageRow, Matrix
from gpuenv.matrix.own import own_row, unknowns
from gpuenv.project.spec import Spec, is_image_base

# Reads the spec's own base: its row and its registry digest.
BaseReader = Callable[[Spec, Matrix], tuple[ImageRow, str]]


@dataclass(frozen=True)
class WithBase:
    """The matrix to resolve against, and the digest of the own base read ("" for a
    matrix family, or a row taken from the lock, whose digest the lock keeps)."""

    matrix: Matrix
    digest: str = ""


def engine_reader(connect: Callable[[], Engine], view: Callable[[], PullView]) -> BaseReader:
    """A BaseReader that pulls the image through the engine `connect` gives and probes it."""

    def read(spec: Spec, matrix: Matrix) -> tuple[ImageRow, str]:
        from gpuenv.images.own_base import read_own_base  # the engine side

        try:
            engine = connect()
            engine.ping()
        except EngineError as exc:
            raise EngineError(
                f"gpuenv.yaml's base is an image of your own ({spec.base}), which gpuenv "
                f"reads from the image itself, and no container engine answers: {exc.message}",
                hint="start Docker or Podman (or set DOCKER_HOST) and run it again; a lock "
                "that already read this base is re-used without one",
            ) from None
        found = read_own_base(engine, spec.base, spec.framework, view())
        row = own_row(spec.framework, spec.base, found.reading, matrix.toolkit_driver)
        return row, found.digest

    return read


def with_own_base(
    spec: Spec,
    matrix: Matrix,
    read: BaseReader | None,
    existing: Lock | None = None,
    *,
    again: bool = False,
) -> WithBase:
    """The matrix with the spec's own base as a row (unchanged for `base: ngc` or
    `dockerhub`): the row `existing` recorded for the same base, unless `again`; else
    the image read by `read`. EngineError when it must be read and nothing can."""
    if not is_image_base(spec.base):
        return WithBase(matrix)
    row = None
    if existing is not None and not again:
        row = own_row_from_lock(existing, spec.base)
    digest = ""
    if row is None:
        if read is None:
            raise EngineError(
                f"gpuenv.yaml's base is an image of your own ({spec.base}); gpuenv reads "
                "it from the image itself, which this command does not do",
                hint="run `gpuenv lock` where a container engine runs",
            )
        row, digest = read(spec, matrix)
    return WithBase(replace(matrix, images=(row, *matrix.images)), digest)


def own_base_notes(row: ImageRow, spec: Spec) -> list[str]:
    """What gpuenv could not read from an own base, said with what it leaves unchecked."""
    if not is_image_base(spec.base) or row.family != spec.base:
        return []
    missing = unknowns(row)
    if not missing:
        return []
    said = "; ".join(what for what, _ in missing)
    fixes = ", ".join(fix for _, fix in missing)
    return [
        f"{spec.base} does not say {said}: give the image {fixes}, then run "
        "`gpuenv lock --upgrade` to read it again"
    ]
