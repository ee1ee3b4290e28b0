"""A conda environment.yml: its ``pip:`` part is read as requirement lines (options such
as ``--extra-index-url`` and ``-e`` included); conda packages cannot be installed into an
NGC image and are reported, with their PyPI name where one exists.
"""

from __future__ import annotations

import os

import yaml

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
from gpuenv.project.sources import OPTION, Collected, read_option, read_project_file


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
            name, _, version = item.partition("=")
            name = name.strip().split("::")[-1]
            where = where_in(project_dir, relative, item)
            version = version.lstrip("=").split("=")[0].strip()
            conda[normalize(name)] = version
            into.conda[normalize(name)] = (version, where)
            _conda_flag(name, item, where, into)
    return conda


def _conda_flag(name: str, item: str, where: str, into: Collected) -> None:
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
            f"NGC image; its pip equivalent is '{pip_name}' (add it to `packages:`)",
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
