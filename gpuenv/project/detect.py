"""What a project folder already says about its environment, and the gpuenv.yaml init writes.

`gpuenv init` reads the dependency sources people already have (requirements.txt with its
includes, pyproject.toml with uv.lock, environment.yml) and `.python-version`, so the first
spec matches the code. The framework is what the project really needs:

1. a direct requirement on it (``torch==2.3.1``, ``jax[cuda12]``, conda's ``pytorch=1.11``,
   or a ``[build-system]`` requirement such as ``torch>=2.5.1``), else
2. a package that needs exactly one framework (``tf-keras`` -> tensorflow, ``flax`` ->
   jax, ``torchvision`` -> pytorch; multi-backend libraries such as transformers count
   for none).

Several frameworks is an error that asks for ``--framework``, never a guess. Variant
files (``requirements_flax.txt``) are not installed, so they are not evidence either.
Python: ``.python-version`` (the interpreter the developer runs), else conda's
``python=``, else ``requires-python``.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from gpuenv.common import nesting
from gpuenv.common.files import NotAFile
from gpuenv.errors import Problem, SpecError
from gpuenv.project.dependencies import read_sources
from gpuenv.project.packages import FRAMEWORK_PACKAGES, IMPLIES
from gpuenv.project.pyproject import (
    build_requirements,
    declared_requirements,
    poetry_constraint,
    table,
)
from gpuenv.project.sources import Collected, Dependency, environment, read_project_file
from gpuenv.project.spec import GpuRequest, default_name

ENVIRONMENT_FILES = ("environment.yml", "environment.yaml")


@dataclass
class Detected:
    framework: str | None = None
    version: str | None = None
    python: str | None = None
    requirements: list[str] = field(default_factory=list)  # the sources gpuenv.yaml names
    found: list[str] = field(default_factory=list)  # "requirements.txt:3: torch==2.3.1"
    also: list[str] = field(default_factory=list)  # what was read and will not be done
    framework_from: str | None = None  # where the framework (and its pin) came from


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


REQUIREMENTS_FOLDER = "requirements"
FOLDER_BASE = ("base.txt", "main.txt", "requirements.txt")  # the shared file of a folder


def default_sources(root: Path) -> list[str]:
    """The dependency files a project installs: requirements.txt (or, without it, the
    shared file of a requirements/ folder: base.txt), a pyproject.toml that declares
    dependencies (or has a uv.lock), environment.yml.

    A name that is there but is no file (a folder, a named pipe, a link to a device or
    to nowhere) is taken all the same: reading it fails, located, with exit 3, as for a
    file named in `requirements:`; it is never skipped as if it were absent."""
    out = []
    folder = root / REQUIREMENTS_FOLDER
    if _there(root / "requirements.txt"):
        out.append("requirements.txt")
    elif folder.is_dir():
        base = next((name for name in FOLDER_BASE if _there(folder / name)), None)
        if base:
            out.append(f"{REQUIREMENTS_FOLDER}/{base}")
    if _there(root / "pyproject.toml"):
        out.append("pyproject.toml")
    out += [name for name in ENVIRONMENT_FILES if _there(root / name)][:1]
    return out


def _there(path: Path) -> bool:
    return os.path.lexists(path)


def _declares(data: dict[str, Any], root: Path) -> bool:
    project = table(data, "project")
    poetry = table(table(data, "tool"), "poetry")
    return bool(
        project.get("dependencies") or poetry.get("dependencies") or (root / "uv.lock").is_file()
    )


def _evidence(items: list[tuple[str, Dependency]]) -> dict[str, list[Dependency]]:
    out: dict[str, list[Dependency]] = {}
    for framework, dependency in items:
        out.setdefault(framework, []).append(dependency)
    return out


def _ambiguous(frameworks: dict[str, list[Dependency]], why: str) -> SpecError:
    problems = []
    for framework, items in frameworks.items():
        first = items[0]
        file, _, line = first.where.partition(":")
        problems.append(
            Problem(
                file,
                int(line) if line.isdigit() else None,
                None,
                None,
                f"{first.requirement} {why} {framework}",
            )
        )
    names = " or ".join(sorted(frameworks))
    return SpecError(
        problems,
        hint=f"this project uses several frameworks: choose one with "
        f"`gpuenv init --framework {names.split(' or ')[0]}` ({names})",
    )


def detect_project(project_dir: str, chosen: str | None = None) -> Detected:
    """Framework, version, Python and dependency sources from the files a project has;
    SpecError (exit 3) for a file gpuenv cannot read, or for several frameworks unless
    `chosen` (``--framework``) picks one of them."""
    root = Path(project_dir)
    detected = Detected()
    sources = default_sources(root)
    pyproject = _read_pyproject(root, sources)
    collected = read_sources(project_dir, tuple(sources))
    collected.raise_problems()
    detected.requirements = [s for s in sources]
    linux = environment(None)
    deps = [d for d in collected.dependencies if not d.constraint and d.applies(linux)]
    frameworks = _gpu_frameworks(
        _evidence(_direct(project_dir, pyproject, collected, deps)), collected, detected
    )
    if frameworks:
        needed = _one_framework(frameworks, chosen, "needs")
        if needed is not None:
            _choose(detected, *needed, implied=False)
    else:
        implied = _evidence([(IMPLIES[d.name], d) for d in deps if d.name in IMPLIES])
        one = _one_framework(implied, chosen, "implies")
        if one is not None:
            _choose(detected, *one, implied=True)
    _python(root, detected, collected, pyproject)
    detected.also += [str(flag) for flag in collected.flags]
    detected.also += _unused(root, sources)
    return detected


def _read_pyproject(root: Path, sources: list[str]) -> dict[str, Any]:
    """The project's pyproject.toml, if `sources` names it; one that declares no
    dependencies is taken out of `sources` (a build-only pyproject installs nothing)."""
    if "pyproject.toml" not in sources:
        return {}
    try:
        pyproject = nesting.loads(
            tomllib.loads, read_project_file(str(root), "pyproject.toml").decode("utf-8")
        )
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError, NotAFile, nesting.TooDeep):
        return {}  # read_sources reports it, located
    if not _declares(pyproject, root):
        sources.remove("pyproject.toml")
    return pyproject


def _direct(
    project_dir: str, pyproject: dict[str, Any], collected: Collected, deps: list[Dependency]
) -> list[tuple[str, Dependency]]:
    """Each direct requirement on a framework, with the framework: declared in
    pyproject.toml, in the sources, as a build requirement, or as a conda package."""
    linux = environment(None)
    building = build_requirements(project_dir, "pyproject.toml", pyproject)
    declared = declared_requirements(project_dir, "pyproject.toml", pyproject)
    direct = [
        (FRAMEWORK_PACKAGES[d.name], d)
        for d in [*declared, *deps, *building]
        if d.name in FRAMEWORK_PACKAGES and d.applies(linux)
    ]
    direct += [
        (FRAMEWORK_PACKAGES[d.name], d)
        for d in collected.conda_pins
        if d.name in FRAMEWORK_PACKAGES
    ]
    return direct


def _gpu_frameworks(
    frameworks: dict[str, list[Dependency]], collected: Collected, detected: Detected
) -> dict[str, list[Dependency]]:
    """The frameworks with a GPU build among their requirements, when some have one: the
    CPU-only ones are then noted in `detected.also`, not taken for the image's."""
    gpu = {
        fw: items
        for fw, items in frameworks.items()
        if not all(_cpu_only(d, collected) for d in items)
    }
    if not gpu or len(gpu) == len(frameworks):
        return frameworks
    detected.also.extend(
        f"{items[0].where}: {items[0].requirement} is a CPU-only build of {fw}: not the "
        "framework of the image"
        for fw, items in frameworks.items()
        if fw not in gpu
    )
    return gpu


def _one_framework(
    frameworks: dict[str, list[Dependency]], chosen: str | None, why: str
) -> tuple[str, list[Dependency]] | None:
    """The framework the evidence points to, narrowed to `chosen` among several; None
    when there is none, or `chosen` is none of several. Several and no choice: SpecError."""
    if len(frameworks) > 1 and chosen in frameworks:
        frameworks = {chosen: frameworks[chosen]}
    if len(frameworks) > 1 and not chosen:
        raise _ambiguous(frameworks, why)
    if len(frameworks) != 1:
        return None
    ((framework, items),) = frameworks.items()
    return framework, items


def _cpu_only(dependency: Dependency, collected: Collected) -> bool:
    """``tensorflow-cpu``, ``jax[cpu]``, or torch from a CPU wheel index."""
    if dependency.name == "tensorflow-cpu" or "cpu" in dependency.requirement.extras:
        return True
    file = dependency.where.partition(":")[0]
    return dependency.name == "torch" and file in collected.cpu_index_files


def _choose(detected: Detected, framework: str, items: list[Dependency], *, implied: bool) -> None:
    detected.framework = framework
    pinned = [d for d in items if d.specifier and d.name in FRAMEWORK_PACKAGES]
    if pinned and not implied:
        specifiers = ",".join(dict.fromkeys(d.specifier for d in pinned))
        detected.version = version_from_specifier(specifiers)
        detected.framework_from = f"{pinned[0].where}: {pinned[0].requirement}"
    else:
        first = items[0]
        what = "needs" if not implied else "implies"
        detected.framework_from = f"{first.where}: {first.requirement} ({what} {framework})"
    detected.found.insert(0, detected.framework_from)


def _version_file_series(word: str) -> str | None:
    """The CPython series a .python-version line names: ``3.11``, ``3.11.4``, uv's
    ``cpython-3.12.1-linux-x86_64-gnu``; None for another interpreter (``pypy3.10``).

    >>> [_version_file_series(w) for w in ("3.11.4", "cpython-3.12.1-linux-x86_64-gnu", "pypy3.10")]
    ['3.11', '3.12', None]
    """
    match = re.fullmatch(r"(?:cpython-)?(\d+\.\d+)(?:\.\d+)?(?:[-+].*)?", word.strip())
    return _python_series(match[1]) if match else None


def _python(root: Path, detected: Detected, collected: Collected, data: dict[str, Any]) -> None:
    if (root / ".python-version").is_file():
        try:
            text = read_project_file(str(root), ".python-version")
        except (OSError, NotAFile) as exc:
            reason = f"it {exc}" if isinstance(exc, NotAFile) else exc.strerror or str(exc)
            detected.also.append(f".python-version: not read: {reason}")
            text = b""
        words = text.decode("utf-8", errors="replace").split()
        series = _version_file_series(words[0]) if words else None
        if series:
            detected.python = series
            detected.found.append(f".python-version: python {words[0]}")
            return
        if words:
            detected.also.append(
                f".python-version: '{words[0]}' is not a CPython version gpuenv can match "
                "(NGC images ship CPython): not used; set `python:` in gpuenv.yaml"
            )
    conda = collected.conda.get("python")
    if conda and _python_series(conda[0]):
        detected.python = _python_series(conda[0])
        detected.found.append(f"{conda[1]}: python={conda[0]}")
        return
    project = table(data, "project")
    requires = project.get("requires-python")
    if isinstance(requires, str) and requires.strip():
        detected.python = requires.strip()
        detected.found.append(f"pyproject.toml requires-python: {requires.strip()}")
        return
    poetry = table(table(table(data, "tool"), "poetry"), "dependencies").get("python")
    if isinstance(poetry, str) and poetry.strip() and poetry.strip() != "*":
        detected.python = poetry_constraint(poetry.strip())
        detected.found.append(f"pyproject.toml [tool.poetry.dependencies] python = {poetry!r}")


def _unused(root: Path, sources: list[str]) -> list[str]:
    """The dependency files of the project that gpuenv.yaml will not install, and the
    layouts gpuenv does not read, each named with what to do."""
    out = []
    variants = sorted(p.name for p in root.glob("requirements*.txt") if p.name not in sources)
    folder = root / REQUIREMENTS_FOLDER
    if folder.is_dir():
        variants += sorted(
            f"{REQUIREMENTS_FOLDER}/{p.name}"
            for p in folder.glob("*.txt")
            if f"{REQUIREMENTS_FOLDER}/{p.name}" not in sources
        )
    if variants:
        out.append(
            f"not installed: {', '.join(variants)} (name a file in `requirements:` to install it)"
        )
    pipenv = [name for name in ("Pipfile", "Pipfile.lock") if (root / name).is_file()]
    if pipenv:
        out.append(
            f"{' and '.join(pipenv)}: not read (gpuenv reads requirements files, "
            "pyproject.toml with uv.lock, and environment.yml): write them out with "
            "`pipenv requirements > requirements.txt`, then run `gpuenv init --force`"
        )
    if (root / "setup.cfg").is_file():
        out.append(
            "setup.cfg: its [options] install_requires are not read (list them in "
            "requirements.txt or pyproject.toml's [project] dependencies)"
        )
    if (root / "pixi.toml").is_file():
        out.append(
            "pixi.toml: not read (gpuenv reads environment.yml): export it with `pixi "
            "project export conda-environment environment.yml`, then run `gpuenv init --force`"
        )
    if (root / "setup.py").is_file():
        out.append(
            "setup.py: dependencies declared in code are not read (list them in "
            "requirements.txt or pyproject.toml)"
        )
    return out


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
    strict_driver: bool = False,
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
# Only images the host's driver runs natively (no minor-version or forward compatibility).
{"strict_driver: true" if strict_driver else "# strict_driver: true"}

# Base image: ngc (NVIDIA NGC containers), dockerhub (Docker Hub's official pytorch and
# tensorflow images) or an image of your own (registry/path:tag), read when locked.
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
