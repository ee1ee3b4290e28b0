"""`gpuenv matrix`: the matrix as tables for people, or JSON for scripts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table

from gpuenv.app.matrix import ImageTable, Overview
from gpuenv.cli import output, ui
from gpuenv.matrix.model import Matrix
from gpuenv.matrix.sync import SyncReport

EVIDENCE_STYLE = {"primary": "green", "image": "cyan", "secondary": "yellow", "unverified": "red"}


def _evidence(level: str, unverified: tuple[str, ...] = ()) -> str:
    text = f"[{EVIDENCE_STYLE[level]}]{level}[/]"
    if unverified:
        text += f" [dim](R: {', '.join(unverified)})[/]"
    return text


FAMILY_TITLES = {"ngc": "NGC", "dockerhub": "Docker Hub"}


def _images(shown: ImageTable) -> tuple[list[dict[str, Any]], Table]:
    table = Table(
        title=f"{FAMILY_TITLES[shown.family]} {shown.name} images ({len(shown.images)})",
        title_justify="left",
    )
    for column in (
        "image",
        "version",
        "CUDA",
        "cuDNN",
        "Python",
        "Ubuntu",
        "driver ≥",
        "DC compat",
        "CC ≥",
        "evidence",
        "from",
    ):
        table.add_column(column, overflow="fold")
    for row, origin, _ in shown.images:
        table.add_row(
            row.image,
            row.framework_version or "?",
            row.cuda or "?",
            row.cudnn or "?",
            row.python or "?",
            row.ubuntu or "?",
            str(row.min_driver or "?"),
            ", ".join(map(str, row.forward_compat)) or "-",
            str(row.min_compute_capability or "?"),
            _evidence(row.evidence, row.unverified),
            origin,
        )
    data = [
        dict(row.to_data(), image=row.image, origin=origin, platforms=platforms)
        for row, origin, platforms in shown.images
    ]
    return data, table


def _cuda(matrix: Matrix) -> tuple[dict[str, Any], list[Table]]:
    compat = Table(
        title="Minor-version compatibility: any CUDA X.y app runs on", title_justify="left"
    )
    compat.add_column("CUDA")
    compat.add_column("driver ≥")
    for major, driver in matrix.minor_compat:
        compat.add_row(f"{major}.x", str(driver))
    toolkits = Table(title="CUDA toolkit → minimum Linux driver", title_justify="left")
    for column in ("toolkit", "version", "driver ≥", "evidence"):
        toolkits.add_column(column)
    for toolkit in matrix.toolkits:
        toolkits.add_row(
            toolkit.label, toolkit.version, str(toolkit.min_driver), _evidence(toolkit.evidence)
        )
    archs = Table(title="Compute capabilities a CUDA toolkit builds for", title_justify="left")
    for column in ("CC", "architecture", "added in CUDA", "removed in CUDA", "evidence"):
        archs.add_column(column)
    for arch in matrix.architectures:
        archs.add_row(
            str(arch.compute_capability),
            arch.architecture,
            arch.added_in or "≤ 11.0",
            arch.removed_in or "-",
            _evidence(arch.evidence),
        )
    data = {
        "minor_version_compat": [
            {"major": m, "min_driver": str(d)} for m, d in matrix.minor_compat
        ],
        "toolkits": [t.to_data() for t in matrix.toolkits],
        "compute_capabilities": [a.to_data() for a in matrix.architectures],
    }
    return data, [compat, toolkits, archs]


def _gpus(matrix: Matrix) -> tuple[list[dict[str, Any]], Table]:
    table = Table(title=f"GPU models ({len(matrix.gpus)})", title_justify="left")
    for column in ("model", "CC", "architecture", "class", "evidence"):
        table.add_column(column)
    for model in sorted(matrix.gpus, key=lambda m: (m.gpu_class, m.name)):
        table.add_row(
            model.name,
            str(model.compute_capability),
            model.architecture,
            model.gpu_class,
            _evidence(model.evidence),
        )
    data = [
        {
            "name": m.name,
            "match": [" ".join(seq) for seq in m.match],
            "compute_capability": str(m.compute_capability),
            "class": m.gpu_class,
            "architecture": m.architecture,
            "evidence": m.evidence,
        }
        for m in matrix.gpus
    ]
    return data, table


def show_matrix(shown: Overview | ImageTable | Matrix, table: str | None, as_json: bool) -> None:
    """`gpuenv matrix [TABLE]`: the overview, a framework's images, or the cuda or gpus
    tables of the matrix; JSON on stdout, warnings on stderr."""
    if isinstance(shown, Overview):
        _show_overview(shown, as_json)
        return
    if isinstance(shown, ImageTable):
        _show_images(shown, as_json)
        return
    if table == "cuda":
        data, tables = _cuda(shown)
        if as_json:
            output.data(data)
        else:
            for item in tables:
                ui.table(item)
        return
    payload, rendered = _gpus(shown)
    if as_json:
        output.data(payload)
    else:
        ui.table(rendered)


def _show_overview(shown: Overview, as_json: bool) -> None:
    if as_json:
        output.data(
            {
                "version": shown.version,
                "directory": shown.directory,
                "images": shown.images,
                "origins": shown.origins,
                "disagreements": [str(d) for d in shown.disagreements],
                "overlay": shown.overlay,
                "toolkits": shown.toolkits,
                "gpus": shown.gpus,
            }
        )
        return
    ui.out.print(f"matrix {shown.version} ({shown.directory})", markup=False)
    for framework, count in shown.images.items():
        ui.out.print(
            f"  {framework:<11} {count:>3} images   gpuenv matrix {framework}", markup=False
        )
    ui.out.print(f"  {'cuda':<11} {shown.toolkits:>3} toolkits gpuenv matrix cuda", markup=False)
    ui.out.print(f"  {'gpus':<11} {shown.gpus:>3} models   gpuenv matrix gpus", markup=False)
    if shown.overlay:
        _origins(shown.origins, shown.disagreements, shown.overlay)


def _show_images(shown: ImageTable, as_json: bool) -> None:
    payload, rendered = _images(shown)
    if as_json:
        output.data(payload)
    else:
        ui.table(rendered)
    if shown.notice:
        ui.warn(shown.notice)  # on stderr: the JSON on stdout keeps its shape
    if shown.unrecorded:
        ui.warn(
            f"? = not recorded: {len(shown.unrecorded)} {shown.name} images have no "
            "framework version in the matrix (why, per row: `framework_version_unknown` in "
            f"--json); {shown.how_to_record}"
        )


def _origins(origins: dict[str, int], conflicts: Sequence[object], path: str) -> None:
    shown = ", ".join(f"{count} {name}" for name, count in sorted(origins.items()))
    ui.out.print(f"image rows: {shown} (overlay {path})", markup=False)
    for conflict in conflicts:
        ui.out.print(f"  disagrees: {conflict}", markup=False)


def show_sync(report: SyncReport, path: str, as_json: bool) -> None:
    """What `gpuenv matrix sync` found: one JSON object, or lines for people."""
    if as_json:
        output.data({**report.to_data(), "overlay": path})
        return
    ui.success(
        f"{len(report.rows)} images in {path} ({report.read} read, {report.reused} unchanged)"
    )
    for image in report.added:
        ui.info(f"  new: {image}")
    for image, names in report.filled.items():
        ui.info(f"  filled: {image}: {', '.join(names)}")
    for conflict in report.disagreements:
        ui.warn(f"disagrees: {conflict}")
    for skipped in report.skipped:
        ui.info(f"  skipped: {skipped}")
