"""The project's pins on packages the image provides, as resolver checks: an image whose
torch (or torchvision, triton, ... where the matrix records them) cannot satisfy a pin the
project's files make is rejected, so resolution steers to one that can; when none can,
the error names the package, the pin and what each candidate ships."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuenv.errors import ResolutionError
from gpuenv.matrix.model import ImageRow
from gpuenv.project.packages import FRAMEWORK_PACKAGES, ngc_satisfies
from gpuenv.resolution.verdicts import Candidate


@dataclass(frozen=True)
class Pin:
    """``torchvision==0.20.1`` from ``requirements.txt:2``."""

    name: str
    specifier: str
    where: str

    def __str__(self) -> str:
        return f"{self.name}{self.specifier} ({self.where})"


def pin_reasons(row: ImageRow, pins: Sequence[Pin]) -> list[str]:
    """Why the row's shipped versions fail the pins (unknown versions: not checked here;
    the build checks them in the image)."""
    out = []
    for pin in pins:
        shipped = row.shipped(pin.name)
        if shipped is None and FRAMEWORK_PACKAGES.get(pin.name) == row.framework:
            out.append(f"its {pin.name} version is not recorded in the matrix ({pin})")
        elif shipped is not None and not ngc_satisfies(pin.specifier, shipped):
            out.append(f"ships {pin.name} {shipped}, not {pin.name}{pin.specifier} ({pin.where})")
    return out


def pins_unsatisfiable(
    pins: Sequence[Pin], candidates: Sequence[Candidate]
) -> ResolutionError | None:
    """The error when the pins alone leave no image: every image that passes the other
    checks is rejected by a pin."""
    if not pins or any(c.ok for c in candidates):
        return None
    others = [c for c in candidates if not c.rejected_by("package")]
    if others:
        return None
    pinned = [c for c in candidates if c.only_rejected_by("package")]
    if not pinned:
        return None
    rejected = {p.name for c in pinned for p in pins if pin_reasons(c.row, [p])}
    wanted = [p for p in pins if p.name in rejected]
    lines = []
    seen: set[str] = set()
    for candidate in pinned:
        shipped = ", ".join(
            f"{p.name} {candidate.row.shipped(p.name) or 'unknown'}" for p in wanted
        )
        if shipped not in seen:
            seen.add(shipped)
            lines.append(f"{candidate.row.label} ({candidate.row.image}) ships {shipped}")
    return ResolutionError(
        "no image ships what the project pins: " + "; ".join(str(p) for p in wanted),
        lines[:8],
        hint="relax the pin to a version an image ships (NVIDIA's builds count as their "
        "series: ==0.20.1 accepts 0.20.0a0+...), or remove it and let the image provide it",
    )
