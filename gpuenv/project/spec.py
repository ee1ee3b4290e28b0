"""gpuenv.yaml -> a frozen Spec, with every problem reported at once, each located.

The spec is the project's single truth: what framework, which versions, what to install,
which GPUs. Validation here is also the first security boundary: every value that later
reaches a Dockerfile or a container is checked here (package names, paths, env names).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from packaging.specifiers import SpecifierSet

from gpuenv.common.versions import parse_constraint
from gpuenv.project.location import SPEC_FILENAME as SPEC_FILENAME  # re-exported
from gpuenv.project.ports import Port, parse_port

# The YAML and version parsers are imported where they are used: `gpuenv run` rebuilds an
# already-validated Spec from its build stamp and needs neither.


def constraint(text: str) -> SpecifierSet:
    return parse_constraint(text)


FRAMEWORKS = ("pytorch", "tensorflow", "jax", "none")
FAMILIES = ("ngc", "dockerhub")
# An image reference a team's own base is named by (Docker's grammar, a tag or a digest
# required): [registry[:port]/]path[:tag][@sha256:hex], path components lowercase.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
IMAGE_REFERENCE = (
    rf"^(?:(?P<registry>localhost(?::[0-9]+)?|{_LABEL}(?:\.{_LABEL})+(?::[0-9]+)?"
    rf"|{_LABEL}:[0-9]+)/)?"
    rf"(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$"
)


def is_image_base(base: str) -> bool:
    """Whether `base` names an image of its own rather than a family of the matrix."""
    return base not in FAMILIES


IPC_MODES = ("host", "private", "shareable")
GPU_KEYWORDS = ("all", "none", "optional")
# A MIG profile is NVIDIA's name for an instance's size: 1g.10gb (one GPU slice, 10 GB),
# 1c.2g.20gb where the compute instance takes fewer slices than its GPU instance, and a
# +me-style suffix for extra engines (NVIDIA/go-nvlib pkg/nvlib/device/mig_profile.go).
# NVIDIA's Kubernetes device plugin names the resource nvidia.com/mig-<profile>.
# Patterns as text: re compiles (and keeps) each on its first use, not at import.
MIG_PROFILE = r"^(?:[1-9]\d?c\.)?[1-9]\d?g\.[1-9]\d*gb(?:\+[a-z]+(?:\.[a-z]+)*)?$"


def is_mig_profile(text: str) -> bool:
    """Whether `text` is a MIG profile name.

    >>> [is_mig_profile(t) for t in ("1g.10gb", "1c.2g.20gb", "1g.10gb+me", "2g", "10gb")]
    [True, True, True, False, False]
    """
    return bool(re.match(MIG_PROFILE, text))


WORKSPACE = "/workspace"

FIELDS = (
    "name",
    "framework",
    "version",
    "python",
    "cuda",
    "base",
    "requirements",
    "extras",
    "packages",
    "apt",
    "env",
    "gpus",
    "shm_size",
    "ipc",
    "mounts",
    "installer",
    "strict_driver",
    "ports",
)
INSTALLERS = ("uv", "pip")  # what installs the Python requirements in a build
# Names people reach for first, mapped to ours, so did-you-mean finds them.
ALIASES = {
    "framework_version": "version",
    "torch": "version",
    "python_version": "python",
    "cuda_version": "cuda",
    "image": "base",
    "requirement": "requirements",
    "requirements_file": "requirements",
    "pip": "packages",
    "dependencies": "packages",
    "apt_packages": "apt",
    "system_packages": "apt",
    "environment": "env",
    "gpu": "gpus",
    "shm": "shm_size",
    "volumes": "mounts",
    "port": "ports",
    "publish": "ports",
    "expose": "ports",
}

_SIZE = r"^(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)$"
_SIZE_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


@dataclass(frozen=True)
class GpuRequest:
    """What the spec asks for: every GPU, none, optional, a count, named devices (GPUs or
    MIG instances by UUID), or `count` MIG instances of one `profile` (mode "mig")."""

    mode: str  # "all" | "none" | "optional" | "count" | "devices" | "mig"
    count: int | None = None
    devices: tuple[str, ...] = ()
    profile: str | None = None  # mode "mig": the MIG profile, e.g. 1g.10gb

    def __str__(self) -> str:
        if self.mode == "count":
            return str(self.count)
        if self.mode == "devices":
            return ",".join(self.devices)
        if self.mode == "mig":
            return f"{self.count}× MIG {self.profile}"
        return self.mode

    def to_data(self) -> str | int | list[str] | dict[str, Any]:
        if self.mode == "count":
            assert self.count is not None
            return self.count
        if self.mode == "devices":
            return list(self.devices)
        if self.mode == "mig":
            return {"mig": self.profile, "count": self.count}
        return self.mode


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool = False


@dataclass(frozen=True)
class Spec:
    """A validated gpuenv.yaml. Constraints keep their text for messages and the lock."""

    project_dir: str
    name: str
    framework: str
    version: str | None = None
    python: str | None = None
    cuda: str | None = None
    base: str = "ngc"
    requirements: tuple[str, ...] = ()
    extras: tuple[str, ...] = ()  # optional dependency groups of pyproject.toml to install
    packages: tuple[str, ...] = ()
    apt: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    gpus: GpuRequest = field(default_factory=lambda: GpuRequest("all"))
    shm_size: int | None = None
    ipc: str | None = None
    mounts: tuple[Mount, ...] = ()
    installer: str = "uv"
    strict_driver: bool = False  # only the CUDA toolkit's own driver (no minor-version compat)
    ports: tuple[Port, ...] = ()  # published by run and shell (`-p` adds to them)
    path: str | None = None

    @property
    def version_spec(self) -> SpecifierSet | None:
        return constraint(self.version) if self.version else None

    @property
    def python_spec(self) -> SpecifierSet | None:
        return constraint(self.python) if self.python else None

    @property
    def cuda_spec(self) -> SpecifierSet | None:
        return constraint(self.cuda) if self.cuda else None

    def to_data(self) -> dict[str, Any]:
        """The spec's meaning as plain data: what the spec hash covers (not comments)."""
        data: dict[str, Any] = {
            "name": self.name,
            "framework": self.framework,
            "version": self.version,
            "python": self.python,
            "cuda": self.cuda,
            "base": self.base,
            "requirements": list(self.requirements),
            "packages": list(self.packages),
            "apt": list(self.apt),
            "env": dict(self.env),
            "gpus": self.gpus.to_data(),
            "shm_size": self.shm_size,
            "ipc": self.ipc,
            "mounts": [
                {"source": m.source, "target": m.target, "read_only": m.read_only}
                for m in self.mounts
            ],
        }
        if self.extras:  # only when set: specs without it keep the digest they had
            data["extras"] = list(self.extras)
        if self.installer != "uv":
            data["installer"] = self.installer
        if self.strict_driver:  # only when set: specs without it keep their digest
            data["strict_driver"] = True
        if self.ports:
            data["ports"] = [str(port) for port in self.ports]
        return data

    def digest(self) -> str:
        """A hash of the spec's meaning for the lock: reformatting or comments do not
        change it, nor does how the build installs (`installer`), which the lock does
        not decide, nor the project's name (by default the folder's: a clone into
        another folder must find its lock current), nor the ports a run publishes."""
        meaning = {
            k: v for k, v in self.to_data().items() if k not in ("installer", "name", "ports")
        }
        blob = json.dumps(meaning, sort_keys=True, separators=(",", ":"))

        return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()

    def with_overrides(self, **values: Any) -> Spec:
        """The spec with command-line values (already validated) in place of its own."""
        given = {key: value for key, value in values.items() if value is not None}
        return replace(self, **given) if given else self


def spec_from_data(data: Mapping[str, Any], project_dir: str, path: str | None) -> Spec:
    """A Spec again from `Spec.to_data()` output (already validated: no checks here)."""
    gpus = data["gpus"]
    if isinstance(gpus, int):
        request = GpuRequest("count", count=gpus)
    elif isinstance(gpus, list):
        request = GpuRequest("devices", devices=tuple(str(d) for d in gpus))
    elif isinstance(gpus, Mapping):
        request = GpuRequest("mig", count=int(gpus["count"]), profile=str(gpus["mig"]))
    else:
        request = GpuRequest(str(gpus))
    return Spec(
        project_dir=project_dir,
        path=path,
        name=data["name"],
        framework=data["framework"],
        version=data["version"],
        python=data["python"],
        cuda=data["cuda"],
        base=data["base"],
        requirements=tuple(data["requirements"]),
        extras=tuple(data.get("extras", ())),
        packages=tuple(data["packages"]),
        apt=tuple(data["apt"]),
        env=tuple(sorted(data["env"].items())),
        gpus=request,
        shm_size=data["shm_size"],
        ipc=data["ipc"],
        mounts=tuple(Mount(**m) for m in data["mounts"]),
        installer=data.get("installer", "uv"),
        strict_driver=bool(data.get("strict_driver", False)),
        ports=tuple(parse_port(text) for text in data.get("ports", ())),
    )


def default_name(project_dir: str) -> str:
    """A valid image name from a folder name: ``My Project`` -> ``my-project``."""
    base = os.path.basename(os.path.abspath(project_dir)).lower()
    cleaned = re.sub(r"[^a-z0-9]+", "-", base).strip("-")
    return cleaned or "project"


def default_spec(project_dir: str, framework: str = "none") -> Spec:
    return Spec(project_dir=project_dir, name=default_name(project_dir), framework=framework)


def display_path(path: str) -> str:
    """A path as the user would type it: relative to the working directory when inside it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def inside_project(project_dir: str, relative: str) -> bool:
    """Whether `relative` (symlinks resolved) is the project folder or inside it."""
    root = os.path.realpath(project_dir)
    target = os.path.realpath(os.path.join(root, relative))
    return target == root or target.startswith(root.rstrip(os.sep) + os.sep)


def parse_size(text: str) -> int | None:
    """``8g`` / ``512MiB`` / ``1073741824`` -> bytes; None when unreadable.

    >>> parse_size("8g"), parse_size("512MiB"), parse_size("1.5G")
    (8589934592, 536870912, 1610612736)
    """
    match = re.match(_SIZE, text.strip(), re.IGNORECASE)
    if not match:
        return None
    number, unit, suffix = match.groups()
    if suffix.lower() == "i":
        return None
    return int(float(number) * _SIZE_UNITS[unit.lower()])
