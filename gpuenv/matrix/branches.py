"""Driver branches as NVIDIA designates them, and the branches its CUDA Compatibility
guide lists per cuda-compat package (matrices/driver-branches.yaml).

Forward compatibility is only a verified route where NVIDIA supports it: on a long-term
or production branch that the guide lists for the image's CUDA minor. These rows are
what the resolver (`gpuenv.resolution.forward`) checks that against.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gpuenv.common.checker import Checker
from gpuenv.common.yamlfile import Path as YamlPath

DESIGNATIONS = ("long-term", "production", "new-feature", "evaluation")
# The designations NVIDIA supports as forward-compatibility targets.
TARGET_DESIGNATIONS = ("long-term", "production")
DESIGNATION_WORDS = {
    "long-term": "a long-term support branch",
    "production": "a production branch",
    "new-feature": "a new-feature branch",
    "evaluation": "an evaluation/developer branch",
}
BRANCH_SOURCE = "NVIDIA's data-center driver lifecycle (matrices/driver-branches.yaml)"
GUIDE_SOURCE = "NVIDIA's CUDA Compatibility guide (r615 edition)"


@dataclass(frozen=True)
class DriverBranch:
    """One driver branch: its designation and end of life, where a source states them."""

    branch: str  # "535"
    designation: str | None  # one of DESIGNATIONS; None where no source says
    end_of_life: str | None  # "YYYY-MM"
    evidence: str
    note: str

    @property
    def target(self) -> bool:
        return self.designation in TARGET_DESIGNATIONS

    def ended_before(self, release: str | None) -> bool:
        """Whether the branch ended before an NGC release month (``"24.10"``)."""
        if self.end_of_life is None or release is None:
            return False
        year, month = release.split(".")
        return self.end_of_life < f"20{year}-{month}"


@dataclass(frozen=True)
class ForwardSupport:
    """The branches the guide marks compatible (C) for the cuda-compat package of one
    CUDA minor (``"12.4"``: R535)."""

    cuda: str
    branches: tuple[str, ...]
    evidence: str
    note: str


_BRANCH = re.compile(r"^\d{3}$")
_MONTH = re.compile(r"^\d{4}-(0[1-9]|1[0-2])$")


def read_branches(
    data: dict[str, Any], rows: Checker, evidence_levels: tuple[str, ...]
) -> tuple[list[DriverBranch], list[ForwardSupport]]:
    """The two lists of a `driver-branches` file, every problem recorded in `rows`."""
    branches: list[DriverBranch] = []
    seen: set[str] = set()
    fields = ("branch", "designation", "end_of_life", "evidence", "note")
    for index, raw in enumerate(_listed(rows, data, "driver_branches")):
        path: YamlPath = ("driver_branches", index)
        entry = rows.mapping(path, raw, fields)
        if entry is None:
            continue
        branch = _branch(rows, (*path, "branch"), entry.get("branch"))
        designation = entry.get("designation")
        if designation is not None:
            designation = rows.choice((*path, "designation"), designation, DESIGNATIONS)
        end = rows.text((*path, "end_of_life"), entry.get("end_of_life"), nullable=True)
        if end is not None and not _MONTH.match(end):
            rows.add((*path, "end_of_life"), f"'{end}' is not a month (YYYY-MM)")
            end = None
        evidence = rows.choice((*path, "evidence"), entry.get("evidence"), evidence_levels)
        note = rows.text((*path, "note"), entry.get("note"), nullable=False)
        if branch in seen:
            rows.add((*path, "branch"), f"branch R{branch} is listed twice")
        if branch and evidence and note:
            seen.add(branch)
            branches.append(DriverBranch(branch, designation, end, evidence, note))
    support: list[ForwardSupport] = []
    for index, raw in enumerate(_listed(rows, data, "forward_compat_support")):
        path = ("forward_compat_support", index)
        entry = rows.mapping(path, raw, ("cuda", "branches", "evidence", "note"))
        if entry is None:
            continue
        cuda = rows.version((*path, "cuda"), entry.get("cuda"), nullable=False)
        if cuda is not None and not re.match(r"^\d+\.\d+$", cuda):
            rows.add((*path, "cuda"), f"'{cuda}' is not a CUDA minor (X.Y)")
            cuda = None
        listed = tuple(
            name
            for i, name in enumerate(rows.text_list((*path, "branches"), entry.get("branches")))
            if _branch(rows, (*path, "branches", i), name)
        )
        evidence = rows.choice((*path, "evidence"), entry.get("evidence"), evidence_levels)
        note = rows.text((*path, "note"), entry.get("note"), nullable=False)
        if cuda and evidence and note:
            support.append(ForwardSupport(cuda, listed, evidence, note))
    return branches, support


def _listed(rows: Checker, data: dict[str, Any], key: str) -> list[Any]:
    value = data.get(key)
    if not isinstance(value, list) or not value:
        rows.add((key,), "expected a non-empty list")
        return []
    return value


def _branch(rows: Checker, path: YamlPath, value: Any) -> str | None:
    """A driver branch: three digits, quoted (``"535"``)."""
    text = rows.text(path, value, nullable=False)
    if text is not None and not _BRANCH.match(text):
        rows.add(path, f"'{text}' is not a driver branch (three digits, e.g. \"535\")")
        return None
    return text
