"""The project's pins on packages the image provides, as resolver checks: an image whose
torch (or torchvision, triton, ... where the matrix records them) cannot satisfy a pin the
project's files make is rejected, so resolution steers to one that can; when none can,
the error names the package, the pin and what each candidate ships."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations

from gpuenv.common.versions import matches, parse_version
from gpuenv.errors import ResolutionError
from gpuenv.matrix.model import FRAMEWORK_NAMES, ImageRow
from gpuenv.project.packages import FRAMEWORK_PACKAGES, ngc_satisfies
from gpuenv.project.spec import Spec
from gpuenv.resolution.verdicts import Candidate


@dataclass(frozen=True)
class Pin:
    """``torchvision==0.20.1`` from ``requirements.txt:2``. A pin implied by a range of a
    companion package (torchvision>=0.16,<0.17) may allow several specifiers, any of
    which will do (`alternatives`: torch==2.1.0, ==2.1.1 or ==2.1.2)."""

    name: str
    specifier: str
    where: str
    alternatives: tuple[str, ...] = ()

    def __str__(self) -> str:
        if self.alternatives:
            return f"{self.name} {' or '.join(self.alternatives)} ({self.where})"
        return f"{self.name}{self.specifier} ({self.where})"

    def allows(self, version: str) -> bool:
        """Whether an image's `version` of the package meets the pin (NVIDIA's builds
        count as the release they precede)."""
        if self.alternatives:
            return any(ngc_satisfies(one, version) for one in self.alternatives)
        return ngc_satisfies(self.specifier, version)


def pin_reasons(row: ImageRow, pins: Sequence[Pin]) -> list[str]:
    """Why the row's shipped versions fail the pins (unknown versions: not checked here;
    the build checks them in the image)."""
    out = []
    for pin in pins:
        shipped = row.shipped(pin.name)
        if shipped is None and FRAMEWORK_PACKAGES.get(pin.name) == row.framework:
            out.append(f"its {pin.name} version is not recorded in the matrix ({pin})")
        elif shipped is not None and not pin.allows(shipped):
            out.append(f"ships {pin.name} {shipped}, not {pin}")
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
            f"{p.name} {candidate.row.shipped(p.name) or '(version not recorded in the matrix)'}"
            for p in wanted
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


def conflicting_pins(
    spec: Spec, pins: Sequence[Pin], rows: Sequence[ImageRow]
) -> ResolutionError | None:
    """Two claims on the framework's version that no image can meet together, though
    each alone can be (the spec's `version: "2.5"` and `torch==2.4.0` in requirements.txt;
    `torch>=2.6` in pyproject.toml and `torch==2.3.1` in requirements.txt): the error
    names both, where each is written, never a hint to move one way."""
    versions = sorted({r.framework_version for r in rows if r.framework_version})
    claims: list[tuple[str, Callable[[str], bool]]] = []
    if spec.version_spec is not None:
        wanted = spec.version_spec
        claims.append((f"gpuenv.yaml's version: '{spec.version}'", lambda v: matches(wanted, v)))
    for pin in pins:
        if FRAMEWORK_PACKAGES.get(pin.name) == spec.framework and pin.specifier:
            claims.append((str(pin), pin.allows))
    name = FRAMEWORK_NAMES.get(spec.framework, spec.framework)
    for (first, holds_first), (second, holds_second) in combinations(claims, 2):
        one = {v for v in versions if holds_first(v)}
        other = {v for v in versions if holds_second(v)}
        if one and other and not one & other:
            return ResolutionError(
                f"{first} and {second} contradict each other: no {name} image meets both",
                [
                    f"{first}: {name} {_series(one)}",
                    f"{second}: {name} {_series(other)}",
                ],
                hint="change one of the two so that they agree (the image's framework "
                "version is the one both must name)",
            )
    return None


def _series(versions: set[str]) -> str:
    """The series the matrix has among `versions`: ``2.4, 2.5``."""
    seen: list[str] = []
    for version in sorted(versions, key=parse_version):
        series = ".".join(str(n) for n in parse_version(version).release[:2])
        if series not in seen:
            seen.append(series)
    return ", ".join(seen)
