"""Validating gpuenv.yaml: raw YAML values -> a frozen Spec, every problem collected
and reported at once, each located (file, line, column, field).

This is the first security boundary: every value that later reaches a Dockerfile or a
container is checked here (package names, paths, env names, sizes, mounts).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import PurePosixPath
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from gpuenv.common.checker import Checker, describe, did_you_mean
from gpuenv.common.files import kind_of
from gpuenv.common.yamlfile import Path as YamlPath
from gpuenv.common.yamlfile import YamlDocument, YamlSyntaxError, parse_yaml, read_yaml
from gpuenv.errors import Problem, SpecError, file_error
from gpuenv.project.gpus import parse_gpus_value
from gpuenv.project.ports import Port, parse_port
from gpuenv.project.spec import (
    ALIASES,
    FAMILIES,
    FIELDS,
    FRAMEWORKS,
    IMAGE_REFERENCE,
    INSTALLERS,
    IPC_MODES,
    SPEC_FILENAME,
    WORKSPACE,
    Mount,
    Spec,
    default_name,
    display_path,
    inside_project,
    parse_size,
)
from gpuenv.project.variables import InvalidReference, references


class SpecChecker(Checker):
    """The checker of one gpuenv.yaml: text fields take what YAML read as a number
    (`version: 2.4`) as written, and the project folder is where paths must stay."""

    def __init__(self, doc: YamlDocument, project_dir: str) -> None:
        super().__init__(doc)
        self.project_dir = project_dir
        self.seen_requirements: tuple[str, ...] = ()  # the valid `requirements` entries

    def text(
        self,
        path: YamlPath,
        value: Any,
        what: str = "text",
        *,
        nullable: bool = False,
        numbers: bool = True,
    ) -> str | None:
        return super().text(path, value, what, nullable=nullable, numbers=numbers)


# Patterns as text: re compiles (and keeps) each on its first use, not at import.
_NAME = r"^[a-z0-9]+(?:[._-][a-z0-9]+)*$"
_APT = r"^[a-z0-9][a-z0-9+.-]+(=[A-Za-z0-9.+~:-]+)?$"
_SAFE_PATH = r"^[A-Za-z0-9._+-]+(/[A-Za-z0-9._+-]+)*$"
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


def load_spec(project_dir: str, filename: str = SPEC_FILENAME) -> Spec:
    """Read and validate `project_dir/filename`; raise SpecError listing every problem."""
    path = os.path.join(project_dir, filename)
    shown = display_path(path)
    if not os.path.isfile(path):
        raise SpecError(
            [Problem(shown, None, None, None, "not found")],
            hint="run `gpuenv init` in the project folder to write one",
        )
    try:
        doc = read_yaml(path, shown)
    except YamlSyntaxError as exc:
        raise SpecError([exc.problem], hint="fix the YAML syntax at that line") from None
    except OSError as exc:
        raise file_error(exc, "read", path) from None
    return spec_from_document(doc, project_dir, path)


def parse_spec_text(text: str, project_dir: str, filename: str = SPEC_FILENAME) -> Spec:
    """Validate spec text (for tests and tools that hold the text already)."""
    try:
        doc = parse_yaml(text, filename)
    except YamlSyntaxError as exc:
        raise SpecError([exc.problem], hint="fix the YAML syntax at that line") from None
    return spec_from_document(doc, project_dir, os.path.join(project_dir, filename))


def spec_from_document(doc: YamlDocument, project_dir: str, path: str | None = None) -> Spec:
    """Validate a parsed gpuenv.yaml; every problem is collected before raising."""
    check = SpecChecker(doc, project_dir)
    data = _fields_mapping(check, doc.data)
    values = _field_values(check, data)
    if values.get("ipc") == "host" and "shm_size" in values:
        check.add(
            ("shm_size",),
            "has no effect with 'ipc: host' (the host's /dev/shm is shared); remove one",
        )
    if values.get("framework") == "none" and "version" in values:
        check.add(("version",), "constrains the framework version, but 'framework' is none")
    if check.problems:
        raise SpecError(sorted(check.problems, key=lambda p: (p.line or 0, p.column or 0)))
    if "name" not in values:
        values["name"] = default_name(project_dir)
    return Spec(project_dir=project_dir, path=path, **values)


def _fields_mapping(check: SpecChecker, data: Any) -> dict[Any, Any]:
    """The document's mapping of fields, each name checked; SpecError at once for an empty
    file or another kind of value, as nothing else can be checked then."""
    if data is None:
        check.add((), "the file is empty; it needs at least 'framework:' (run `gpuenv init`)")
        raise SpecError(check.problems)
    if not isinstance(data, dict):
        check.add(
            (),
            f"expected a mapping of fields (framework: ..., version: ...), got {describe(data)}",
        )
        raise SpecError(check.problems)
    for key in data:
        if not isinstance(key, str):
            check.add((), f"field names must be text, got {describe(key)}")
        elif key not in FIELDS:
            check.add((key,), f"unknown field '{key}'{did_you_mean(key, FIELDS, ALIASES)}")
    return data


def _field_values(check: SpecChecker, data: dict[Any, Any]) -> dict[str, Any]:
    """The valid value of each field given, read in this order (so problems keep it); a
    missing 'framework' (the one required field) and a field without a value are problems."""
    parsers: tuple[tuple[str, Callable[[Any], Any]], ...] = (
        ("name", lambda v: _name(check, v)),
        ("framework", lambda v: check.choice(("framework",), v, FRAMEWORKS, ALIASES)),
        ("version", lambda v: check.constraint(("version",), v)),
        ("python", lambda v: check.constraint(("python",), v)),
        ("cuda", lambda v: check.constraint(("cuda",), v)),
        ("base", lambda v: _base(check, v)),
        ("requirements", lambda v: _requirements(check, v)),
        ("extras", lambda v: _extras(check, v)),
        ("packages", lambda v: _packages(check, v)),
        ("apt", lambda v: _apt(check, v)),
        ("env", lambda v: _env(check, v)),
        ("gpus", lambda v: parse_gpus_value(check, v)),
        ("shm_size", lambda v: _size(check, v)),
        ("ipc", lambda v: check.choice(("ipc",), v, IPC_MODES, ALIASES)),
        ("mounts", lambda v: _mounts(check, v)),
        ("ports", lambda v: _ports(check, v)),
        ("installer", lambda v: check.choice(("installer",), v, INSTALLERS)),
        ("strict_driver", lambda v: _flag(check, "strict_driver", v)),
    )
    values: dict[str, Any] = {}
    for key, parse in parsers:
        if key not in data:
            if key == "framework":
                check.add(
                    (), f"missing required field 'framework' (one of {', '.join(FRAMEWORKS)})"
                )
        elif data[key] is None:
            check.add((key,), "has no value; remove the line or give a value")
        else:
            result = parse(data[key])
            if result is not None:
                values[key] = result
    return values


def _name(check: SpecChecker, value: Any) -> str | None:
    text = check.text(("name",), value, "a project name")
    if text is None:
        return None
    if not re.match(_NAME, text) or len(text) > 63:
        check.add(
            ("name",),
            f"'{text}' is not a valid name: use lowercase letters, digits and . _ - "
            f"(for example '{default_name(text) if text else 'my-project'}')",
        )
        return None
    return text


def _base(check: SpecChecker, value: Any) -> str | None:
    """A family of the matrix (ngc, dockerhub), or an image reference with a tag or a
    digest (``registry.example.com/team/train:2025.03``)."""
    text = check.text(("base",), value, "ngc, dockerhub or an image reference")
    if text is None or text in FAMILIES:
        return text
    if "/" not in text and ":" not in text and "@" not in text:
        return check.choice(("base",), text, FAMILIES, ALIASES)
    match = re.match(IMAGE_REFERENCE, text)
    if match is None:
        check.add(
            ("base",),
            f"'{text}' is not an image reference (registry/path:tag, lowercase path, "
            "for example 'registry.example.com/team/train:2025.03')",
        )
        return None
    if not match.group("tag"):
        check.add(
            ("base",),
            f"'{text}' names no tag: add one (`{text.partition('@')[0]}:2025.03`); a digest "
            "may follow it, and gpuenv.lock pins the digest either way",
        )
        return None
    return text


def _flag(check: SpecChecker, key: str, value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    check.add((key,), f"expected true or false, got {value!r}")
    return None


def _requirements(check: SpecChecker, value: Any) -> tuple[str, ...] | None:
    out = []
    for path, text in check.located_texts(("requirements",), value, "requirements file paths"):
        if os.path.isabs(text) or text.startswith("~"):
            check.add(path, f"'{text}' must be a path relative to the project folder")
        elif not inside_project(check.project_dir, text):
            check.add(path, f"'{text}' points outside the project folder")
        elif not re.match(_SAFE_PATH, text):
            check.add(
                path,
                f"'{text}' has characters gpuenv does not copy into images "
                "(use letters, digits, . _ + - and /)",
            )
        elif kind_of(os.path.join(check.project_dir, text)):
            what = kind_of(os.path.join(check.project_dir, text))
            check.add(path, f"'{text}' is {what}, not a file: name a requirements file")
        elif not os.path.isfile(os.path.join(check.project_dir, text)):
            check.add(path, f"'{text}' does not exist in the project folder")
        else:
            out.append(PurePosixPath(text).as_posix())
    check.seen_requirements = tuple(out)
    return tuple(out)


def _extras(check: SpecChecker, value: Any) -> tuple[str, ...] | None:
    """Names of optional dependency groups (PEP 621 extras, PEP 735 groups, Poetry)."""
    out = []
    for path, text in check.located_texts(("extras",), value, "optional dependency group names"):
        if not re.match(_NAME, text.lower()):
            check.add(path, f"'{text}' is not an optional dependency group name")
        else:
            out.append(canonicalize_name(text))
    if out and not any(r.endswith(".toml") for r in check.seen_requirements):
        check.add(("extras",), "selects groups of pyproject.toml, but 'requirements' names none")
    return tuple(out)


def _packages(check: SpecChecker, value: Any) -> tuple[str, ...] | None:
    items = check.located_texts(("packages",), value, "pip requirements")
    if not items:
        return ()
    out = []
    for path, text in items:
        try:
            Requirement(text)
        except InvalidRequirement as exc:
            first = str(exc).splitlines()[0]
            check.add(path, f"'{text}' is not a valid pip requirement (PEP 508): {first}")
            continue
        out.append(text.strip())
    return tuple(out)


def _apt(check: SpecChecker, value: Any) -> tuple[str, ...] | None:
    out = []
    for path, text in check.located_texts(("apt",), value, "Debian package names"):
        if not re.match(_APT, text):
            check.add(
                path,
                f"'{text}' is not a Debian package name (lowercase letters, digits, + - .; "
                "optionally =VERSION)",
            )
        else:
            out.append(text)
    return tuple(out)


def _env(check: SpecChecker, value: Any) -> tuple[tuple[str, str], ...] | None:
    if not isinstance(value, dict):
        check.add(("env",), f"expected a mapping of NAME: value, got {describe(value)}")
        return None
    out = []
    for key, item in value.items():
        if not isinstance(key, str) or not re.match(_ENV_NAME, key):
            check.add(("env", str(key)), f"'{key}' is not a valid environment variable name")
            continue
        if isinstance(item, bool):
            check.add(
                ("env", key),
                f"write the value in quotes ('{str(item).lower()}'): YAML reads it as a boolean",
            )
            continue
        text = check.text(("env", key), item, "a text value (write '' for an empty one)")
        if text is None:
            continue
        try:
            references(text)
        except InvalidReference as exc:
            check.add(("env", key), str(exc))
            continue
        out.append((key, text))
    return tuple(sorted(out))


def _size(check: SpecChecker, value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        size: int | None = value
    else:
        text = check.text(("shm_size",), value, "a size like 8g or 512m")
        if text is None:
            return None
        size = parse_size(text)
    if size is None or size < 1024**2:
        check.add(
            ("shm_size",),
            f"{describe(value)} is not a size of at least 1m (write e.g. 8g or 512m)",
        )
        return None
    return size


def _ports(check: SpecChecker, value: Any) -> tuple[Port, ...] | None:
    """`ports: [8888, "0:6006", "0.0.0.0:9000:8000"]`: each as `-p` takes it, each
    container port once."""
    items = value if isinstance(value, list) else [value]
    out: list[Port] = []
    for index, item in enumerate(items):
        path: YamlPath = ("ports", index) if isinstance(value, list) else ("ports",)
        try:
            port = parse_port(item)
        except ValueError as exc:
            check.add(path, str(exc))
            continue
        if any(p.key == port.key for p in out):
            check.add(path, f"the container's port {port.key} is listed twice")
            continue
        out.append(port)
    return tuple(out)


def _mounts(check: SpecChecker, value: Any) -> tuple[Mount, ...] | None:
    if not isinstance(value, list):
        check.add(("mounts",), f"expected a list of mounts, got {describe(value)}")
        return None
    out: list[Mount] = []
    for index, item in enumerate(value):
        path: YamlPath = ("mounts", index)
        mount = _mount(check, path, item)
        if mount is not None:
            if any(m.target == mount.target for m in out):
                check.add(path, f"two mounts have the target '{mount.target}'")
                continue
            out.append(mount)
    return tuple(out)


def _mount(check: SpecChecker, path: YamlPath, item: Any) -> Mount | None:
    if isinstance(item, str):
        parts = item.split(":")
        if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
            check.add(path, f"'{item}' is not SOURCE:TARGET or SOURCE:TARGET:ro")
            return None
        fields: Mapping[str, Any] = {
            "source": parts[0],
            "target": parts[1],
            "read_only": len(parts) == 3 and parts[2] == "ro",
        }
    elif isinstance(item, dict):
        fields = item
        for key in item:
            if key not in ("source", "target", "read_only"):
                check.add(
                    (*path, str(key)),
                    f"unknown mount field '{key}'"
                    f"{did_you_mean(str(key), ('source', 'target', 'read_only'))}",
                )
    else:
        check.add(
            path,
            f"expected SOURCE:TARGET or a mapping with source and target, got {describe(item)}",
        )
        return None
    ok = True
    source = check.text((*path, "source"), fields.get("source"), "a source path")
    target = check.text(
        (*path, "target"), fields.get("target"), "an absolute path in the container"
    )
    read_only = fields.get("read_only", False)
    if not isinstance(read_only, bool):
        check.add((*path, "read_only"), f"expected true or false, got {describe(read_only)}")
        ok = False
    if source is not None and (not source or "," in source or ":" in source):
        check.add(
            (*path, "source"), f"'{source}' is not a usable path (empty, or contains ',' or ':')"
        )
        ok = False
    if target is not None:
        target_parts = target.split("/")
        if not target.startswith("/") or ".." in target_parts or "," in target or ":" in target:
            check.add(
                (*path, "target"), f"'{target}' must be an absolute path without '..', ',' or ':'"
            )
            ok = False
        elif target.rstrip("/") in ("", WORKSPACE):
            check.add(
                (*path, "target"), f"'{target}' is reserved (the project is mounted at {WORKSPACE})"
            )
            ok = False
    if not ok or source is None or target is None:
        return None
    return Mount(source=source, target=target.rstrip("/") or "/", read_only=bool(read_only))
