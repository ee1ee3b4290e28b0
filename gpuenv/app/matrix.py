"""`gpuenv matrix`: what the matrix holds, a table of it, and where its image rows came
from; `gpuenv matrix sync`: rows derived from NGC images' own metadata, read from a
registry into the user's overlay. The CLI shows what these return."""

from __future__ import annotations

import datetime
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from gpuenv.engine.protocol import RegistryReader
from gpuenv.errors import MatrixError
from gpuenv.images import registry as images_registry
from gpuenv.matrix import overlay
from gpuenv.matrix.load import load_matrix
from gpuenv.matrix.model import FRAMEWORK_NAMES, ImageRow, Matrix
from gpuenv.matrix.overlay import Disagreement, OverlayRow
from gpuenv.matrix.sync import Progress, SyncReport, how_to_record, repositories_of, sync


@dataclass(frozen=True)
class Overview:
    """`gpuenv matrix`: what the matrix holds, and where its image rows came from."""

    version: str
    directory: str
    images: dict[str, int]  # NGC images per framework
    toolkits: int
    gpus: int
    origins: dict[str, int]  # image rows per origin: shipped, image, shipped + image
    disagreements: list[Disagreement]  # shipped values the overlay's images contradict
    overlay: str | None  # the overlay file, where it holds rows


class ListedImage(NamedTuple):
    """A row of a framework table: the image row, where it came from, and the platforms
    the overlay read it is built for (None: `matrix sync` has not read it)."""

    row: ImageRow
    origin: str
    platforms: list[str] | None


@dataclass(frozen=True)
class ImageTable:
    """`gpuenv matrix pytorch` (tensorflow, jax, none): one framework's images of one
    family, newest first."""

    framework: str
    name: str  # as people write it: PyTorch, TensorFlow, JAX, CUDA
    family: str  # ngc, dockerhub
    images: list[ListedImage]
    notice: str | None  # what a user must know of NGC's images of it as a whole
    unrecorded: list[str]  # the tags whose framework version the matrix lacks
    how_to_record: str  # how a user records one


def matrix_view(table: str | None, base: str) -> Overview | ImageTable | Matrix:
    """What `gpuenv matrix [TABLE]` shows, the user's overlay merged in: the Overview
    without a table, the ImageTable of a framework's `base` images (ngc, dockerhub), the
    Matrix itself for the cuda and gpus tables. MatrixError for a damaged matrix or
    overlay."""
    matrix = load_matrix()
    source = overlay.read_source()
    rows = overlay.parse_rows(source[1], source[0]) if source else ()
    if table is None:
        return _overview(matrix, rows)
    if table in ("cuda", "gpus"):
        return matrix
    return _image_table(matrix, rows, table, base)


def _overview(matrix: Matrix, rows: Sequence[OverlayRow]) -> Overview:
    """The counts `gpuenv matrix` shows, with the origins and disagreements of the rows."""
    return Overview(
        version=matrix.version,
        directory=matrix.directory,
        images={framework: len(matrix.images_for(framework)) for framework in FRAMEWORK_NAMES},
        toolkits=len(matrix.toolkits),
        gpus=len(matrix.gpus),
        origins=dict(Counter(overlay.origin(row) for row in matrix.images)),
        disagreements=overlay.disagreements(matrix, rows),
        overlay=overlay.overlay_path() if rows else None,
    )


def _image_table(
    matrix: Matrix, rows: Sequence[OverlayRow], framework: str, family: str
) -> ImageTable:
    """The `family` images of `framework`, each with its origin and synced platforms."""
    platforms = {(found.repository, found.tag): list(found.platforms) for found in rows}
    images = matrix.images_for(framework, family)
    return ImageTable(
        framework=framework,
        name=FRAMEWORK_NAMES[framework],
        family=family,
        images=[
            ListedImage(row, overlay.origin(row), platforms.get((row.repository, row.tag)))
            for row in images
        ],
        notice=matrix.notice(framework) if family == "ngc" else None,
        unrecorded=[]
        if framework == "none"
        else [row.tag for row in images if not row.framework_version],
        how_to_record=how_to_record(framework),
    )


class SyncSource(NamedTuple):
    """The registry `gpuenv matrix sync` reads: its host, the scheme a client must use
    (None: the client's choice) and the credentials it has for it (None: none)."""

    host: str
    scheme: str | None
    credentials: dict[str, str] | None

    @classmethod
    def for_registry(cls, registry: str | None) -> SyncSource:
        """The registry to read: `registry` (HOST[:PORT]; over plain HTTP where it starts
        with http://), else the mirror of nvcr.io that GPUENV_REGISTRY_MIRROR or the user
        config names, else nvcr.io; with NGC_API_KEY as the credentials for nvcr.io. A
        `registry` or mirror that is no HOST[:PORT] raises
        `images.registry.InvalidMirror`, a ValueError."""
        host = (
            images_registry.check_mirror(registry)
            if registry
            else images_registry.registry_mirror()[0] or images_registry.NGC_REGISTRY
        )
        scheme = "http" if registry and registry.startswith("http://") else None
        return cls(host, scheme, images_registry.credentials(f"{host}/nvidia/pytorch"))


class Synced(NamedTuple):
    """What `gpuenv matrix sync` found, and the overlay file it wrote."""

    report: SyncReport
    path: str


def sync_matrix(
    source: SyncSource,
    client_for: Callable[[SyncSource], RegistryReader],
    repositories: Sequence[str],
    *,
    progress: Progress,
    step: Callable[[str], None],
    warn: Callable[[str], None],
) -> Synced:
    """Read the tags of `repositories` (``pytorch``, ``nvidia/pytorch``; none: all of the
    matrix's NGC ones) from the registry, and write the rows
    their images give into the user's overlay, over its rows of other repositories: the
    report and the overlay's path. The registry is `source`, read by the client
    `client_for` makes for it (an engine adapter, which the composition root picks).
    `step` says what is read, `progress` each tag; a damaged overlay is rewritten, which
    `warn` says. PullError for a repository the matrix does not have, or a registry that
    fails."""
    host, client = source.host, client_for(source)
    shipped = load_matrix(with_overlay=False)
    path = overlay.overlay_path()
    previous = _previous_rows(path, warn)
    repos = repositories_of(shipped, repositories)
    step(f"reading {', '.join(repos)} from {host}")
    report = sync(client, shipped, repos, previous, progress)
    synced = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    overlay.write(path, overlay.overlay_text(host, synced, report.rows))
    return Synced(report, path)


def _previous_rows(path: str, warn: Callable[[str], None]) -> tuple[OverlayRow, ...]:
    """The rows the overlay at `path` holds; none where there is no overlay, or where it
    is damaged (it is rewritten, not fatal here: `warn` says so)."""
    source = overlay.read_source(path)
    if not source:
        return ()
    try:
        return overlay.parse_rows(source[1], path)
    except MatrixError as exc:
        warn(f"the overlay {path} is damaged and is rewritten ({exc})")
        return ()
