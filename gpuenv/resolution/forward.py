"""Forward compatibility only where NVIDIA supports it (issue 22, item 6).

A data-center GPU whose driver is below an image's minimum may still run it through the
image's cuda-compat libraries. Two NVIDIA sources say on which branches: the image's own
list (its NVIDIA_REQUIRE_CUDA branches, the row's `forward_compat`) and the CUDA
Compatibility guide's table per cuda-compat package; and NVIDIA's driver lifecycle says
which branches are targets at all (long-term and production ones, never new-feature
ones, never one that ended before the image). A plain route needs all three to agree;
where the two lists disagree, or the lifecycle does not know the branch, the route is
taken but marked unverified, naming both sources.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuenv.common.versions import DriverVersion
from gpuenv.matrix.branches import (
    BRANCH_SOURCE,
    DESIGNATION_WORDS,
    GUIDE_SOURCE,
    DriverBranch,
    ForwardSupport,
)
from gpuenv.matrix.model import ImageRow, Matrix
from gpuenv.resolution.verdicts import HostGpu

MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]


@dataclass(frozen=True)
class Forward:
    """How forward compatibility judges one image on one driver: a `route` (verified or
    not), or `why_not` (None: neither source lists the branch)."""

    route: str | None = None
    verified: bool = True
    why_not: str | None = None


def forward_verdict(
    row: ImageRow, matrix: Matrix, driver: DriverVersion, gpus: Sequence[HostGpu]
) -> Forward:
    """Whether `driver`, below the image's minimum, runs it by forward compatibility."""
    branch = driver.branch
    entry = next((d for d in row.forward_compat if d.branch == branch), None)
    if entry is not None and driver < entry:
        # The image's own list names this branch from a later release on: below it the
        # container runtime refuses, whatever the guide says of the branch.
        return Forward(
            why_not=f"on R{branch} its forward compatibility needs ≥ {entry} (the image's "
            f"own list); this host has {driver}"
        )
    image_lists = entry is not None
    support = matrix.forward_support_for(row.cuda) if row.cuda else None
    guide_lists = support is not None and str(branch) in support.branches
    life = matrix.driver_branch(branch)
    if not image_lists and not guide_lists:
        feature = life is not None and life.designation is not None and not life.target
        return Forward(
            why_not=_not_a_target(row, matrix, branch, life, support)
            if feature
            else _elsewhere(row)
        )
    consumer = next((g for g in gpus if not g.datacenter), None)
    if consumer is not None:
        kind = consumer.gpu_class or "not a known data-center"
        article = "an" if kind[:1] in "aeiou" else "a"
        return Forward(
            why_not=f"forward compatibility with R{branch} works on data-center GPUs only, "
            f"and {consumer.name} is {article} {kind} GPU"
        )
    if not gpus:
        return Forward(why_not=f"forward compatibility with R{branch} needs the GPUs to be known")
    refused = _not_a_target(row, matrix, branch, life, support, guide_lists)
    if refused:
        return Forward(why_not=refused)
    doubts = _doubts(row, branch, life, support, image_lists, guide_lists)
    on = f"R{branch} ≥ {entry}" if entry else f"R{branch}"
    if not doubts:
        return Forward(f"CUDA forward compatibility: data-center GPU on {on}")
    route = f"CUDA forward compatibility, unverified: data-center GPU on {on}; " + "; ".join(doubts)
    return Forward(route, verified=False)


def _elsewhere(row: ImageRow) -> str | None:
    if not row.forward_compat:
        return None
    branches = ", ".join(f"R{d.branch} ≥ {d}" for d in row.forward_compat)
    return f"data-center GPUs also run it on {branches}"


def _not_a_target(
    row: ImageRow,
    matrix: Matrix,
    branch: int,
    life: DriverBranch | None,
    support: ForwardSupport | None,
    guide_lists: bool = False,
) -> str | None:
    """Why NVIDIA's lifecycle rules R`branch` out as a target for this image, if it does.
    A branch that ended (by an NVIDIA page) before the image is refused even where the
    guide's table still marks it: the guide itself says end-of-life branches are not
    supported targets, and the message says that the table still lists it."""
    if life is None:
        return None
    if life.designation is not None and not life.target:
        use = _targets(matrix, support, row.release)
        return (
            f"R{branch} is {DESIGNATION_WORDS[life.designation]} ({BRANCH_SOURCE}: "
            f"{life.note}), and NVIDIA's CUDA Compatibility guide says new-feature branches "
            f"are not forward-compatibility targets; use a long-term or production branch"
            + (f" ({use} for CUDA {support.cuda})" if use and support else "")
        )
    if life.ended_before(row.release) and life.evidence == "primary":
        table = (
            f" (its table still marks R{branch} for cuda-compat-{support.cuda.replace('.', '-')})"
            if guide_lists and support
            else ""
        )
        return (
            f"R{branch} reached its end of life in {_month(life.end_of_life)} "
            f"({BRANCH_SOURCE}), before this image ({row.release}); NVIDIA's CUDA "
            f"Compatibility guide says end-of-life branches are not supported targets{table}"
        )
    return None


def _targets(matrix: Matrix, support: ForwardSupport | None, release: str | None) -> str:
    """The long-term and production branches the guide lists for a CUDA minor that had
    not ended before the image."""
    if support is None:
        return ""
    listed = []
    for name in support.branches:
        life = matrix.driver_branch(int(name))
        if life is not None and life.target and not life.ended_before(release):
            listed.append(f"R{name}")
    return " or ".join(listed)


def _doubts(
    row: ImageRow,
    branch: int,
    life: DriverBranch | None,
    support: ForwardSupport | None,
    image_lists: bool,
    guide_lists: bool,
) -> list[str]:
    """What keeps a forward route from being verified: the sources that disagree or say
    nothing, each named."""
    out = []
    cuda = ".".join(row.cuda.split(".")[:2]) if row.cuda else "?"
    image_source = "the image's own list (NVIDIA_REQUIRE_CUDA)"
    if image_lists and not guide_lists:
        if row.cuda is None:
            out.append(
                f"{image_source} names R{branch}, but the image's CUDA version is not "
                f"recorded, so {GUIDE_SOURCE} cannot be read for it"
            )
        elif support is None:
            out.append(
                f"{image_source} names R{branch}, but {GUIDE_SOURCE} has no row for "
                f"cuda-compat-{cuda.replace('.', '-')}"
            )
        else:
            listed = ", ".join(f"R{b}" for b in support.branches) or "no branch"
            out.append(
                f"{image_source} names R{branch}, but {GUIDE_SOURCE} does not list it for "
                f"cuda-compat-{cuda.replace('.', '-')} (it lists {listed})"
            )
    if guide_lists and not image_lists:
        what = "does not name it" if row.forward_compat else "is empty (not known)"
        out.append(
            f"{GUIDE_SOURCE} lists R{branch} for cuda-compat-{cuda.replace('.', '-')}, but "
            f"{image_source} {what}: the container runtime may refuse to start it"
        )
    if life is None or life.designation is None:
        out.append(f"R{branch}'s designation is not recorded in {BRANCH_SOURCE}")
    elif life.ended_before(row.release):
        out.append(
            f"R{branch} ended in {_month(life.end_of_life)} by {life.evidence} sources, "
            f"before this image ({row.release})"
        )
    return out


def _month(value: str | None) -> str:
    """``"2026-06"`` -> ``"June 2026"``."""
    if value is None:
        return "an unknown month"
    year, month = value.split("-")
    return f"{MONTHS[int(month) - 1]} {year}"
