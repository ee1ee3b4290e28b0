"""What a project folder already says about its environment, and the gpuenv.yaml init writes.

`gpuenv init` reads the pins people already have (requirements*.txt, pyproject.toml,
environment.yml, .python-version) so the first spec matches the code: ``torch==2.3.1``
becomes ``framework: pytorch`` with ``version: "2.3"``.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from gpuenv.project.spec import GpuRequest, default_name

# Distribution names (normalized) -> framework, in the order a tie is broken.
FRAMEWORK_PACKAGES = {
    "torch": "pytorch",
    "pytorch": "pytorch",  # conda's name
    "jax": "jax",
    "jaxlib": "jax",
    "tensorflow": "tensorflow",
    "tensorflow-gpu": "tensorflow",
    "tensorflow-cpu": "tensorflow",
    "tf-nightly": "tensorflow",
}
PRIORITY = ("pytorch", "jax", "tensorflow")


@dataclass
class Detected:
    framework: str | None = None
    version: str | None = None
    python: str | None = None
    requirements: list[str] = field(default_factory=list)
    found: list[str] = field(default_factory=list)  # "requirements.txt: torch==2.3.1"
    also: list[str] = field(default_factory=list)  # other frameworks seen


def _normalize(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def version_from_specifier(text: str) -> str | None:
    """``==2.3.1`` -> ``2.3`` (the series); other specifiers are kept as written.

    >>> version_from_specifier("==2.3.1+cu121"), version_from_specifier(">=2.1,<2.5")
    ('2.3', '>=2.1,<2.5')
    """
    text = text.strip()
    if not text:
        return None
    if text.startswith("==") and "," not in text:
        try:
            release = Version(text[2:].strip().rstrip(".*")).release
        except InvalidVersion:
            return None
        return ".".join(str(n) for n in release[:2])
    return text


def _python_series(text: str) -> str | None:
    try:
        release = Version(text.strip()).release
    except InvalidVersion:
        return None
    return ".".join(str(n) for n in release[:2]) if len(release) >= 2 else None


def _requirement_lines(path: Path) -> list[str]:
    lines = []
    for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line and not line.startswith(("#", "-")):
            lines.append(line)
    return lines


class _Finder:
    def __init__(self) -> None:
        self.detected = Detected()
        self.frameworks: dict[str, tuple[str | None, str]] = {}

    def requirement(self, text: str, where: str) -> None:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            return
        framework = FRAMEWORK_PACKAGES.get(_normalize(requirement.name))
        if framework and framework not in self.frameworks:
            version = version_from_specifier(str(requirement.specifier))
            self.frameworks[framework] = (version, f"{where}: {text}")

    def conda(self, text: str, where: str) -> None:
        name, _, version = text.partition("=")
        name = name.strip()
        version = version.lstrip("=").strip()
        if name == "python" and version:
            self.python(version, where)
            return
        framework = FRAMEWORK_PACKAGES.get(_normalize(name))
        if framework and framework not in self.frameworks:
            series = version_from_specifier(f"=={version}") if version else None
            self.frameworks[framework] = (series, f"{where}: {text}")

    def python(self, text: str, where: str, *, series: bool = True) -> None:
        if self.detected.python is None:
            value = _python_series(text) if series else text.strip()
            if value:
                self.detected.python = value
                self.detected.found.append(f"{where}: python {text.strip()}")

    def finish(self) -> Detected:
        chosen = next((f for f in PRIORITY if f in self.frameworks), None)
        if chosen:
            version, where = self.frameworks[chosen]
            self.detected.framework = chosen
            self.detected.version = version
            self.detected.found.insert(0, where)
            self.detected.also = [f for f in self.frameworks if f != chosen]
        return self.detected


def detect_project(project_dir: str) -> Detected:
    """Framework, version, Python and requirements files from the files a project has."""
    root = Path(project_dir)
    finder = _Finder()
    requirement_files = sorted(
        root.glob("requirements*.txt"), key=lambda p: (p.name != "requirements.txt", p.name)
    )
    for path in requirement_files:
        for line in _requirement_lines(path):
            finder.requirement(line, path.name)
    if (root / "requirements.txt").is_file():
        finder.detected.requirements.append("requirements.txt")
    _pyproject(root / "pyproject.toml", finder)
    for name in ("environment.yml", "environment.yaml"):
        _environment(root / name, finder)
    version_file = root / ".python-version"
    if version_file.is_file():
        lines = version_file.read_text(encoding="utf-8", errors="replace").split()
        if lines:
            finder.python(lines[0], ".python-version")
    return finder.finish()


def _pyproject(path: Path, finder: _Finder) -> None:
    if not path.is_file():
        return
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        return
    project = data.get("project", {})
    if not isinstance(project, dict):
        return
    for dependency in project.get("dependencies", []) or []:
        if isinstance(dependency, str):
            finder.requirement(dependency, "pyproject.toml")
    requires = project.get("requires-python")
    if isinstance(requires, str):
        finder.python(requires, "pyproject.toml requires-python", series=False)


def _environment(path: Path, finder: _Finder) -> None:
    if not path.is_file():
        return
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError):
        return
    if not isinstance(data, dict):
        return
    for item in data.get("dependencies", []) or []:
        if isinstance(item, str):
            finder.conda(item, path.name)
        elif isinstance(item, dict):
            for pip_item in item.get("pip", []) or []:
                if isinstance(pip_item, str):
                    finder.requirement(pip_item, f"{path.name} (pip)")


def _q(value: Any) -> str:
    """A YAML scalar that reads back as the same string (JSON strings are valid YAML)."""
    return json.dumps(value)


def render_spec(
    project_dir: str,
    detected: Detected,
    *,
    framework: str,
    version: str | None,
    python: str | None,
    cuda: str | None,
    gpus: GpuRequest,
) -> str:
    """A commented gpuenv.yaml; every value is quoted so YAML cannot reinterpret it."""
    found = "; ".join(detected.found) if detected.found else "nothing detected"

    def line(key: str, value: str | None, example: str) -> str:
        return f"{key}: {_q(value)}" if value else f"# {key}: {_q(example)}"

    requirements = "\n".join(f"  - {_q(r)}" for r in detected.requirements)
    gpu_value = gpus.to_data()
    return f"""\
# gpuenv.yaml: this project's GPU environment. gpuenv resolves it against the
# compatibility matrix and this host, and pins the result in gpuenv.lock.
# After editing, run `gpuenv lock`; commit both files.
# Every field is described in the docs: docs/reference/spec.md.
# Detected when this file was written: {found}.

name: {_q(default_name(project_dir))}

# pytorch | tensorflow | jax | none (a plain CUDA image).
framework: {framework}

# Framework version (PEP 440). "2.3" means 2.3.*; NGC builds such as
# 2.3.0a0+40ec155e58 count as the release they precede (2.3.0).
{line("version", version, "2.4")}
# Python in the image ("3.10" means 3.10.*).
{line("python", python, "3.10")}
# CUDA toolkit in the image. Unset: the newest the host driver supports.
{line("cuda", cuda, ">=12.4")}

# Image family: ngc (NVIDIA NGC containers).
base: ngc

# pip requirements files installed into the image (paths inside this folder).
requirements:{(chr(10) + requirements) if requirements else " []"}
# Extra pip requirements (PEP 508), and Debian packages for apt.
packages: []
apt: []

# Environment variables for the container.
env: {{}}

# GPUs: all | none | optional | a count (2) | indices or UUIDs ([0, 2]).
gpus: {_q(gpu_value) if isinstance(gpu_value, str) else json.dumps(gpu_value)}
# Shared memory for DataLoader workers (Docker's default of 64m is too small),
# or `ipc: host` to share the host's.
shm_size: "8g"
# More folders to mount, e.g. - {{source: /data, target: /data, read_only: true}}
mounts: []
"""
