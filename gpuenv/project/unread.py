"""Framework pins in the layouts gpuenv does not read: Pipfile, setup.cfg, pixi.toml.

gpuenv installs what requirements files, pyproject.toml with uv.lock, and environment.yml
declare. A project whose framework version is written only in one of these other files
would otherwise be locked on the newest image with exit 0: on another framework version
than the one the team pinned. `gpuenv init` reads them just far enough to find such a
pin, and refuses with the fix (issue 31); nothing else in them is read.
"""

from __future__ import annotations

import configparser
import re
import tomllib
from dataclasses import dataclass
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement

from gpuenv.common import nesting
from gpuenv.common.files import NotAFile
from gpuenv.project.conda import conda_spec
from gpuenv.project.packages import CONDA_TO_PIP, FRAMEWORK_PACKAGES, normalize
from gpuenv.project.pyproject import line_of, table
from gpuenv.project.sources import read_project_file


@dataclass(frozen=True)
class UnreadPin:
    """``torch==2.1.2`` written in ``Pipfile`` line 7, which gpuenv does not read."""

    file: str
    line: int | None
    name: str
    specifier: str

    @property
    def framework(self) -> str:
        return FRAMEWORK_PACKAGES[self.name]

    def __str__(self) -> str:
        return f"{self.name}{self.specifier}"


# Each layout and how to turn it into one gpuenv reads.
FIXES = {
    "Pipfile": "`pipenv requirements > requirements.txt`",
    "setup.cfg": "move [options] install_requires into requirements.txt or pyproject.toml's "
    "[project] dependencies",
    "pixi.toml": "`pixi project export conda-environment environment.yml`",
}


def unread_pins(project_dir: str) -> list[UnreadPin]:
    """Every framework version pin in Pipfile, setup.cfg and pixi.toml (unpinned or
    unreadable entries are no pin: the other notes name the files)."""
    out: list[UnreadPin] = []
    for name, reader in (("Pipfile", _pipfile), ("setup.cfg", _setup_cfg), ("pixi.toml", _pixi)):
        try:
            text = read_project_file(project_dir, name).decode("utf-8")
        except (OSError, NotAFile, UnicodeDecodeError):
            continue
        for package, specifier in reader(text):
            if package in FRAMEWORK_PACKAGES and specifier:
                line = line_of(project_dir, name, _first_word(package, text))
                out.append(UnreadPin(name, line, package, specifier))
    return out


def _first_word(package: str, text: str) -> str:
    """How the file writes the package's name (`torch`, `"torch"`), for its line."""
    match = re.search(rf"(?i)\b{re.escape(package).replace('-', '[-_.]')}\b", text)
    return match[0] if match else package


def _toml(text: str) -> dict[str, Any]:
    try:
        return nesting.loads(tomllib.loads, text)
    except (tomllib.TOMLDecodeError, nesting.TooDeep):
        return {}


def _version(value: Any) -> str:
    """A Pipfile or pixi version: ``"==2.1.2"``, ``"*"``, or ``{version = "..."}``."""
    if isinstance(value, dict):
        value = value.get("version")
    if not isinstance(value, str) or value.strip() in ("", "*"):
        return ""
    return value.strip()


def _pipfile(text: str) -> list[tuple[str, str]]:
    data = _toml(text)
    return [
        (normalize(name), _version(value))
        for section in ("packages", "dev-packages")
        for name, value in table(data, section).items()
    ]


def _setup_cfg(text: str) -> list[tuple[str, str]]:
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(text)
    except configparser.Error:
        return []
    raw = parser.get("options", "install_requires", fallback="")
    out = []
    for line in raw.replace(";", "\n;").splitlines():
        try:
            requirement = Requirement(line.strip())
        except InvalidRequirement:
            continue
        out.append((normalize(requirement.name), str(requirement.specifier)))
    return out


def _pixi(text: str) -> list[tuple[str, str]]:
    data = _toml(text)
    out = []
    for name, value in table(data, "pypi-dependencies").items():
        version = _version(value)
        out.append((normalize(name), version if version[:1] in "=<>!~" or not version else ""))
    for name, value in table(data, "dependencies").items():
        version = _version(value)
        if not version:
            continue
        try:
            _, specifier = conda_spec(
                f"{name} {version}" if version[:1].isdigit() else name + version
            )
        except ValueError:
            continue
        pip = CONDA_TO_PIP.get(normalize(name)) or normalize(name)
        out.append((normalize(pip), specifier))
    return out
