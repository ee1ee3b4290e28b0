"""`gpuenv matrix`: the matrix as tables for people, or JSON for scripts."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from rich.table import Table

from gpuenv.cli import output, ui
from gpuenv.matrix.load import FRAMEWORK_NAMES, Matrix
from gpuenv.matrix.overlay import OverlayRow, disagreements, origin, overlay_path
from gpuenv.matrix.sync import SyncReport, how_to_record

EVIDENCE_STYLE = {"primary": "green", "image": "cyan", "secondary": "yellow", "unverified": "red"}


def _evidence(level: str, unverified: tuple[str, ...] = ()) -> str:
    text = f"[{EVIDENCE_STYLE[level]}]{level}[/]"
    if unverified:
        text += f" [dim](R: {', '.join(unverified)})[/]"
    return text


FAMILY_TITLES = {"ngc": "NGC", "dockerhub": "Docker Hub"}


def _images(
    matrix: Matrix, framework: str, overlay: Sequence[OverlayRow], family: str = "ngc"
) -> tuple[list[dict[str, Any]], Table]:
    rows = matrix.images_for(framework, family)
    platforms = {(found.repository, found.tag): list(found.platforms) for found in overlay}
    table = Table(
        title=f"{FAMILY_TITLES[family]} {FRAMEWORK_NAMES[framework]} images ({len(rows)})",
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
    for row in rows:
        table.add_row(
            row.image,
            row.framework_version or "?",
            row.cuda or "?",
            row.cudnn or "?",
            row.python or "?",
            row.ubuntu or "?",
            row.min_driver or "?",
            ", ".join(row.forward_compat) or "-",
            row.min_compute_capability or "?",
            _evidence(row.evidence, row.unverified),
            origin(row),
        )
    data = [
        dict(
            asdict(row),
            image=row.image,
            origin=origin(row),
            platforms=platforms.get((row.repository, row.tag)),
        )
        for row in rows
    ]
    return data, table


def _cuda(matrix: Matrix) -> tuple[dict[str, Any], list[Table]]:
    compat = Table(
        title="Minor-version compatibility: any CUDA X.y app runs on", title_justify="left"
    )
    compat.add_column("CUDA")
    compat.add_column("driver ≥")
    for major, driver in matrix.minor_compat:
        compat.add_row(f"{major}.x", driver)
    toolkits = Table(title="CUDA toolkit → minimum Linux driver", title_justify="left")
    for column in ("toolkit", "version", "driver ≥", "evidence"):
        toolkits.add_column(column)
    for toolkit in matrix.toolkits:
        toolkits.add_row(
            toolkit.label, toolkit.version, toolkit.min_driver, _evidence(toolkit.evidence)
        )
    archs = Table(title="Compute capabilities a CUDA toolkit builds for", title_justify="left")
    for column in ("CC", "architecture", "added in CUDA", "removed in CUDA", "evidence"):
        archs.add_column(column)
    for arch in matrix.architectures:
        archs.add_row(
            arch.compute_capability,
            arch.architecture,
            arch.added_in or "≤ 11.0",
            arch.removed_in or "-",
            _evidence(arch.evidence),
        )
    data = {
        "minor_version_compat": [{"major": m, "min_driver": d} for m, d in matrix.minor_compat],
        "toolkits": [asdict(t) for t in matrix.toolkits],
        "compute_capabilities": [asdict(a) for a in matrix.architectures],
    }
    return data, [compat, toolkits, archs]


def _gpus(matrix: Matrix) -> tuple[list[dict[str, Any]], Table]:
    table = Table(title=f"GPU models ({len(matrix.gpus)})", title_justify="left")
    for column in ("model", "CC", "architecture", "class", "evidence"):
        table.add_column(column)
    for model in sorted(matrix.gpus, key=lambda m: (m.gpu_class, m.name)):
        table.add_row(
            model.name,
            model.compute_capability,
            model.architecture,
            model.gpu_class,
            _evidence(model.evidence),
        )
    data = [
        {
            "name": m.name,
            "match": [" ".join(seq) for seq in m.match],
            "compute_capability": m.compute_capability,
            "class": m.gpu_class,
            "architecture": m.architecture,
            "evidence": m.evidence,
        }
        for m in matrix.gpus
    ]
    return data, table


def show_matrix(
    matrix: Matrix,
    table: str | None,
    as_json: bool,
    overlay: Sequence[OverlayRow] = (),
    family: str = "ngc",
) -> None:
    if table is None:
        counts = {fw: len(matrix.images_for(fw)) for fw in FRAMEWORK_NAMES}
        origins = Counter(origin(row) for row in matrix.images)
        conflicts = disagreements(matrix, overlay)
        if as_json:
            output.data(
                {
                    "version": matrix.version,
                    "directory": matrix.directory,
                    "images": counts,
                    "origins": dict(origins),
                    "disagreements": [str(d) for d in conflicts],
                    "overlay": overlay_path() if overlay else None,
                    "toolkits": len(matrix.toolkits),
                    "gpus": len(matrix.gpus),
                }
            )
            return
        ui.out.print(f"matrix {matrix.version} ({matrix.directory})", markup=False)
        for framework, count in counts.items():
            ui.out.print(
                f"  {framework:<11} {count:>3} images   gpuenv matrix {framework}", markup=False
            )
        ui.out.print(
            f"  {'cuda':<11} {len(matrix.toolkits):>3} toolkits gpuenv matrix cuda", markup=False
        )
        ui.out.print(
            f"  {'gpus':<11} {len(matrix.gpus):>3} models   gpuenv matrix gpus", markup=False
        )
        if overlay:
            _origins(origins, conflicts)
        return
    if table == "cuda":
        data, tables = _cuda(matrix)
        if as_json:
            output.data(data)
        else:
            for item in tables:
                ui.table(item)
        return
    payload, rendered = (
        _gpus(matrix) if table == "gpus" else _images(matrix, table, overlay, family)
    )
    if as_json:
        output.data(payload)
    else:
        ui.table(rendered)
    notice = matrix.notice(table) if family == "ngc" else None
    if notice:
        ui.warn(notice)  # on stderr: the JSON on stdout keeps its shape
    rows = [] if table in ("gpus", "none") else matrix.images_for(table, family)
    unknown = [row.tag for row in rows if not row.framework_version]
    if unknown:
        ui.warn(
            f"? = not recorded: {len(unknown)} {FRAMEWORK_NAMES[table]} images have no "
            "framework version in the matrix (why, per row: `framework_version_unknown` in "
            f"--json); {how_to_record(table)}"
        )


def _origins(origins: Counter[str], conflicts: Sequence[object]) -> None:
    shown = ", ".join(f"{count} {name}" for name, count in sorted(origins.items()))
    ui.out.print(f"image rows: {shown} (overlay {overlay_path()})", markup=False)
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
