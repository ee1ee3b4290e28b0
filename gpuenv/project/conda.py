"""A conda environment.yml: its ``pip:`` part is read as requirement lines (options such
as ``--extra-index-url`` and ``-e`` included); conda packages cannot be installed into an
NGC image and are reported, with their PyPI name where one exists.
"""

from __future__ import annotations

import os
import re

import yaml
from packaging.requirements import Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from gpuenv.common import nesting
from gpuenv.common.files import NotAFile
from gpuenv.errors import file_error
from gpuenv.project.packages import (
    CONDA_PROVIDED_BY_IMAGE,
    CONDA_TO_PIP,
    FRAMEWORK_OR_COUPLED,
    normalize,
)
from gpuenv.project.pyproject import add_requirement, line_of, where_in
from gpuenv.project.sources import (
    OPTION,
    Collected,
    Dependency,
    read_option,
    read_project_file,
)


def read_environment(project_dir: str, relative: str, into: Collected) -> dict[str, str]:
    """The ``pip:`` requirements of a conda environment file (read as requirement lines);
    conda packages flagged. Returns the conda packages' versions by name (python, ...)."""
    try:
        text = read_project_file(project_dir, relative).decode("utf-8")
        data = nesting.loads(yaml.safe_load, text)
    except NotAFile as exc:
        into.problem(relative, None, str(exc))
        return {}
    except (FileNotFoundError, NotADirectoryError, UnicodeDecodeError) as exc:
        into.problem(relative, None, f"cannot read: {exc}")
        return {}
    except OSError as exc:  # permissions, I/O: the environment's problem, exit 8
        raise file_error(exc, "read", os.path.join(project_dir, relative)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        into.problem(relative, line, "is not valid YAML")
        return {}
    except nesting.TooDeep as exc:
        into.problem(relative, None, f"is not valid YAML: {exc}")
        return {}
    into.files.append(relative)
    conda: dict[str, str] = {}
    items = data.get("dependencies") if isinstance(data, dict) else None
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict):
            for line in item.get("pip", []) or []:
                if not isinstance(line, str):
                    continue
                number = line_of(project_dir, relative, line)
                option = OPTION.match(line.strip()) if line.strip().startswith("-") else None
                if option:
                    read_option(
                        project_dir,
                        relative,
                        number or 0,
                        option[1],
                        (option[2] or "").strip(),
                        into,
                        constraint=False,
                        chain=(relative,),
                    )
                else:
                    add_requirement(project_dir, relative, line.strip(), into)
        elif isinstance(item, str):
            _conda_package(item, where_in(project_dir, relative, item), into, conda)
    return conda


def _conda_package(item: str, where: str, into: Collected, conda: dict[str, str]) -> None:
    """One conda package line: noted (python's version), flagged, and for a framework
    a pin as exact as the same pin in requirements.txt, which steers the image choice."""
    try:
        name, specifier = conda_spec(item)
    except ValueError as exc:
        file, _, line = where.partition(":")
        into.problem(file, int(line) if line.isdigit() else None, str(exc))
        return
    version = _plain_version(specifier)
    conda[name] = version
    into.conda[name] = (version, where)
    pip_name = CONDA_TO_PIP.get(name)
    if pip_name in FRAMEWORK_OR_COUPLED:
        into.conda_pins.append(Dependency(Requirement(f"{pip_name}{specifier}"), where))
    _conda_flag(name, item, specifier, where, into)


# A conda match spec in environment.yml (conda's "package match specifications"):
# `[channel::]name[ version[ build]]` or `[channel::]name<op>version[=build]`.
_NAME = re.compile(r"^(?:[A-Za-z0-9_.\-/]+::)?(?P<name>[A-Za-z0-9_.\-]+)(?P<rest>.*)$")
_OPERATOR = re.compile(r"^(==|!=|>=|<=|>|<|~=|=)")


def conda_spec(item: str) -> tuple[str, str]:
    """A conda match spec as its (normalized) name and the pip version specifier that
    means the same; ValueError for what gpuenv cannot map (`|` alternatives, brackets).

    conda's `=1.2` is fuzzy (1.2, 1.2.1, ...): pip's `==1.2.*`; `==1.2` is exact; the
    comparison operators are pip's; `name 1.2.*` (space) is `==1.2.*` and `name 1.2` exact;
    a build string (`=1.2=py310_0`, `name 1.2 py310_0`) is conda's and left out.

    >>> [conda_spec(s) for s in ("jax=0.4.26", "pytorch==2.1.2", "numpy>=1.20,<2", "scipy 1.11.*")]
    [('jax', '==0.4.26.*'), ('pytorch', '==2.1.2'), ('numpy', '<2,>=1.20'), ('scipy', '==1.11.*')]
    >>> conda_spec("conda-forge::python=3.10=h1234_0"), conda_spec("jax 0.4.26 py310_0")
    (('python', '==3.10.*'), ('jax', '==0.4.26'))
    """
    text = item.strip()
    if "|" in text or "[" in text:
        raise ValueError(
            f"conda package '{text}': alternatives (|) and [key=value] specs are not read: "
            "write one version range (e.g. 'numpy>=1.20,<2')"
        )
    words = text.split()
    match = _NAME.match(words[0]) if words and len(words) <= 3 else None
    if match is None or (len(words) > 1 and match["rest"]):
        raise ValueError(f"conda package '{text}' is not a conda match spec gpuenv can read")
    name = normalize(match["name"])
    version = words[1] if len(words) > 1 else match["rest"]
    if version and not _OPERATOR.match(version) and not words[1:]:
        raise ValueError(f"conda package '{text}' is not a conda match spec gpuenv can read")
    if not version:
        return name, ""
    if version.startswith("=") and not version.startswith("=="):
        version = version[1:].split("=")[0]  # `=1.2=build`: the build is conda's
        pip = f"=={version}" if version.endswith("*") else f"=={version}.*"
    elif version.startswith("=="):
        pip = "==" + version[2:].split("=")[0]  # `==1.2=build`: the build is conda's
    elif _OPERATOR.match(version):
        pip = version
    else:  # `name 1.2.*` / `name 1.2`
        pip = f"=={version}"
    pip = pip.replace(".*.*", ".*")
    try:
        return name, str(SpecifierSet(pip))
    except InvalidSpecifier:
        raise ValueError(
            f"conda package '{text}': '{version}' is not a version gpuenv can map to pip's"
        ) from None


def _plain_version(specifier: str) -> str:
    """``==3.10.*`` -> ``3.10`` (what `python=3.10` names); other specifiers as written."""
    if specifier.startswith("==") and "," not in specifier:
        return specifier[2:].removesuffix(".*")
    return specifier


def _conda_flag(name: str, item: str, specifier: str, where: str, into: Collected) -> None:
    key = normalize(name)
    if key in ("python", "pip"):
        return
    if key in CONDA_PROVIDED_BY_IMAGE:
        into.flag(where, f"conda package {item}: not installed; the NGC image provides CUDA")
        return
    pip_name = CONDA_TO_PIP.get(key, "")
    if pip_name and pip_name in FRAMEWORK_OR_COUPLED:
        into.flag(
            where,
            f"conda package {item}: not installed; the image provides NVIDIA's build of {pip_name}",
        )
    elif pip_name:
        into.flag(
            where,
            f"conda package {item}: conda packages cannot be installed into an "
            f"NGC image; its pip equivalent is '{pip_name}{specifier}' (add it to `packages:`)",
        )
    elif pip_name is None:
        into.flag(
            where,
            f"conda package {item}: not installed (conda's own; the image has "
            "what it needs or apt: provides it)",
        )
    else:
        into.flag(
            where,
            f"conda package {item}: conda packages cannot be installed into an "
            "NGC image, and gpuenv knows no pip equivalent",
        )
