"""The project's dependencies as one list, and what the image build does with each.

`read_dependencies` reads every source the spec names in ``requirements:`` (requirements
files with their includes, pyproject.toml, uv.lock beside it, environment.yml) and the
spec's ``packages:``. `plan_install` sorts them against the image:

- packages NVIDIA builds into the image (torch, torchvision, torchaudio, triton, ...) are
  left to the image: the build checks the image's version against the project's pin (in
  the NGC sense, `gpuenv.project.packages.ngc_satisfies`) and never reinstalls them; an
  unpinned companion the image does not ship is held to the series of the image's torch;
- packages that compile against torch are installed last, without build isolation;
- everything else is installed with pip, with the image's framework builds as constraints.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from packaging.requirements import Requirement

from gpuenv.errors import Problem, SpecError
from gpuenv.project.conda import read_environment
from gpuenv.project.packages import (
    COMPILES_AGAINST_TORCH,
    COUPLED,
    FRAMEWORK_PACKAGES,
    build_label,
    companion_series,
)
from gpuenv.project.pyproject import read_pyproject
from gpuenv.project.sources import Collected, Dependency, Flag, environment, read_requirements_file
from gpuenv.project.spec import WORKSPACE, Spec

PACKAGES_WHERE = "gpuenv.yaml packages"


def source_kind(relative: str) -> str:
    """``pyproject`` | ``conda`` | ``requirements``, from the file's name."""
    name = os.path.basename(relative)
    if name.endswith(".toml"):
        return "pyproject"
    if name.endswith((".yml", ".yaml")):
        return "conda"
    return "requirements"


def read_sources(
    project_dir: str,
    sources: tuple[str, ...],
    *,
    extras: tuple[str, ...] = (),
    python: str | None = None,
    packages: tuple[str, ...] = (),
) -> Collected:
    """Every dependency the sources declare; problems are collected, not raised."""
    collected = Collected()
    for relative in sources:
        kind = source_kind(relative)
        if kind == "pyproject":
            read_pyproject(project_dir, relative, extras, python, collected)
        elif kind == "conda":
            read_environment(project_dir, relative, collected)
        else:
            read_requirements_file(project_dir, relative, collected)
    for text in packages:
        collected.dependencies.append(Dependency(Requirement(text), PACKAGES_WHERE))
    for folder, (_, chosen) in list(collected.local_projects.items()):
        manifest = os.path.normpath(os.path.join(folder, "pyproject.toml"))
        if manifest not in collected.files:  # `-e .` beside `requirements: [pyproject.toml]`
            read_pyproject(project_dir, manifest, chosen, python, collected)
        collected.run_paths.append(workspace_path(project_dir, folder))
    return collected


def read_dependencies(spec: Spec, python: str | None = None) -> Collected:
    """The spec's dependencies; SpecError (exit 3) listing every located problem."""
    collected = read_sources(
        spec.project_dir,
        spec.requirements,
        extras=spec.extras,
        python=python or _exact_python(spec.python),
        packages=spec.packages,
    )
    collected.raise_problems()
    return collected


def _exact_python(text: str | None) -> str | None:
    if text and text.replace(".", "").isdigit():
        return text
    return None


def workspace_path(project_dir: str, folder: str) -> str:
    """Where a project folder's packages are in a run: its src/ (the src layout) when it
    has one, else the folder, below /workspace.

    >>> workspace_path("/nonexistent", ".")
    '/workspace'
    """
    base = WORKSPACE if folder in ("", ".") else f"{WORKSPACE}/{folder}"
    return f"{base}/src" if os.path.isdir(os.path.join(project_dir, folder, "src")) else base


def coupled_names(framework: str) -> frozenset[str]:
    own = {name for name, fw in FRAMEWORK_PACKAGES.items() if fw == framework}
    return frozenset(own | set(COUPLED.get(framework, ())))


@dataclass(frozen=True)
class ImagePin:
    """A package the image provides (or should): the project's pin, checked in the image."""

    name: str
    specifier: str
    where: str
    hold: str = ""  # the series to install when the image lacks it (companions)

    def line(self) -> str:
        return "\t".join((self.name, self.specifier, self.where, self.hold))


@dataclass(frozen=True)
class InstallPlan:
    image: tuple[ImagePin, ...]
    install: tuple[Dependency, ...]
    no_isolation: tuple[Dependency, ...]
    constraints: tuple[Dependency, ...]
    options: tuple[str, ...]
    flags: tuple[Flag, ...]
    files: tuple[str, ...] = ()  # the project files it was read from (relative paths)
    framework: str = "none"
    require_hashes: tuple[str, ...] = ()  # where --require-hashes was said
    paths: tuple[str, ...] = ()  # project folders on the path in runs (`-e .`), in /workspace

    @property
    def empty(self) -> bool:
        return not (self.image or self.install or self.no_isolation or self.paths)

    def notes(self) -> list[str]:
        """What the build will do that a user would not guess, one line each."""
        out = [str(flag) for flag in self.flags]
        for pin in self.image:
            wanted = pin.specifier or "unpinned"
            label = build_label(pin.specifier)
            if label:
                out.append(
                    f"{pin.where}: {pin.name}{pin.specifier}: +{label} names "
                    f"{_label_text(label)}; the image's own build replaces it (the pin is "
                    f"read as {pin.name}{pin.specifier.partition('+')[0]})"
                )
            if pin.hold:
                out.append(
                    f"{pin.where}: {pin.name} ({wanted}) left to the image; if the image lacks "
                    f"it, {pin.name}=={pin.hold}.* (the build for its torch) without dependencies"
                )
            else:
                out.append(f"{pin.where}: {pin.name} ({wanted}) left to the image's own build")
        for dependency in self.install:
            other = FRAMEWORK_PACKAGES.get(dependency.name)
            if other and other != self.framework:
                out.append(
                    f"{dependency.where}: {dependency.name} is {other}, not this image's "
                    f"framework: pip installs a PyPI build of it"
                )
        for path in self.paths:
            out.append(
                f"the project's folder {path} is on the path in runs (as `pip install -e` "
                "would make it), its declared dependencies installed; its console scripts "
                "are not installed (run them as `python3 -m`)"
            )
        for dependency in self.no_isolation:
            out.append(
                f"{dependency.where}: {dependency.name} compiles against the image's torch: "
                "installed without build isolation, unless the image ships it"
            )
        return out


def _label_text(label: str) -> str:
    """``cu121`` -> "a build for CUDA 12.1" (pytorch.org's wheel index names)."""
    if label.startswith("cu") and label[2:].isdigit() and len(label) >= 5:
        return f"a build for CUDA {label[2:-1]}.{label[-1]}"
    if label == "cpu":
        return "a CPU-only build"
    return f"a build for {label.upper() if label == 'xpu' else 'ROCm ' + label[4:]}"


def plan_install(
    collected: Collected,
    framework: str,
    framework_version: str | None,
    python: str | None = None,
) -> InstallPlan:
    """Sort the dependencies into what the image keeps, what pip installs, and how."""
    env = environment(_exact_python(python))
    coupled = coupled_names(framework)
    image: dict[str, ImagePin] = {}
    install: list[Dependency] = []
    late: list[Dependency] = []
    constraints: list[Dependency] = []
    for dependency in collected.dependencies:
        if not dependency.applies(env):
            continue
        name = dependency.name
        if dependency.constraint:
            if name not in coupled:
                constraints.append(dependency)
            continue
        if name in coupled:
            image[name] = _merge(image.get(name), dependency, framework_version)
        elif framework == "pytorch" and name in COMPILES_AGAINST_TORCH:
            late.append(dependency)
        else:
            install.append(dependency)
    return InstallPlan(
        image=tuple(image.values()),
        install=tuple(install),
        no_isolation=tuple(late),
        constraints=tuple(constraints),
        options=tuple(dict.fromkeys(collected.options)),
        flags=tuple(collected.flags),
        files=tuple(collected.files),
        framework=framework,
        require_hashes=tuple(collected.require_hashes),
        paths=tuple(collected.run_paths),
    )


def _merge(
    existing: ImagePin | None, dependency: Dependency, framework_version: str | None
) -> ImagePin:
    specifier = dependency.specifier
    if existing is not None:
        both = ",".join(s for s in (existing.specifier, specifier) if s)
        return ImagePin(existing.name, both, existing.where, existing.hold)
    hold = ""
    if framework_version and dependency.name in ("torchvision", "torchaudio"):
        hold = companion_series(framework_version, dependency.name) or ""
    return ImagePin(dependency.name, specifier, dependency.where, hold)


def needs_python(spec: Spec, image: str, python: str | None, framework: str) -> None:
    """Python requirements need an image with Python: the plain CUDA images have none."""
    if framework != "none" or python:
        return

    raise SpecError(
        [
            Problem(
                os.path.basename(spec.path or "gpuenv.yaml"),
                None,
                None,
                "framework",
                f"is none, and {image} has no Python (the matrix records none), but the spec "
                "installs Python requirements",
            )
        ],
        hint="choose a framework image (framework: pytorch, tensorflow or jax), or remove "
        "`requirements:` and `packages:` (apt: [python3-pip] adds Debian's Python, which "
        "gpuenv does not manage)",
    )


def check_installable(
    spec: Spec, image: str, python: str | None, framework_version: str | None
) -> None:
    """What `gpuenv check` refuses of the dependencies on an image, refused the same way
    before a lock is written (`lock`, `init`): one validator, so a lock `check` would
    reject is never written. SpecError (exit 3)."""
    if not (spec.requirements or spec.packages):
        return
    collected = read_dependencies(spec, python)
    plan = plan_install(collected, spec.framework, framework_version, python)
    if not plan.empty:
        needs_python(spec, image, python, spec.framework)
