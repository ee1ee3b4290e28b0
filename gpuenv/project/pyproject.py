"""Dependencies declared in pyproject.toml (PEP 621 and Poetry), pinned in uv.lock, or
listed in a conda environment.yml, read into `gpuenv.project.sources.Collected`.

- PEP 621: ``[project] dependencies`` plus the optional groups the spec's ``extras`` names
  (``[project.optional-dependencies]`` or PEP 735 ``[dependency-groups]``).
- Poetry: ``[tool.poetry.dependencies]`` (and ``extras``/groups), caret and tilde ranges
  turned into PEP 440 (``^2.3.0`` -> ``>=2.3.0,<3.0.0``).
- uv: with a uv.lock beside pyproject.toml, the exact versions it pins for the project's
  dependencies and the selected extras (what ``uv export`` installs); index sources of
  ``[tool.uv.sources]`` that point at framework wheel indexes are reported.
(conda's environment.yml: `gpuenv.project.conda`.)
"""

from __future__ import annotations

import os
import re
import tomllib
from typing import Any

from packaging.markers import InvalidMarker, Marker
from packaging.requirements import InvalidRequirement, Requirement

from gpuenv.common import nesting
from gpuenv.common.files import NotAFile
from gpuenv.errors import file_error
from gpuenv.project.packages import (
    FRAMEWORK_OR_COUPLED,
    FRAMEWORK_PACKAGES,
    framework_index,
    normalize,
)
from gpuenv.project.sources import (
    Collected,
    Dependency,
    environment,
    parse_requirement,
    read_project_file,
)

UV_LOCK = "uv.lock"


def table(data: Any, key: str) -> dict[str, Any]:
    """``data[key]`` when it is a table, else an empty one (files say odd things)."""
    value = data.get(key) if isinstance(data, dict) else None
    return value if isinstance(value, dict) else {}


def load_toml(project_dir: str, relative: str, into: Collected) -> dict[str, Any] | None:
    """The TOML document, or None with a located problem (an unparsable pyproject is an
    error, never "nothing declared")."""
    try:
        data = nesting.loads(
            tomllib.loads, read_project_file(project_dir, relative).decode("utf-8")
        )
    except NotAFile as exc:
        into.problem(relative, None, str(exc))
        return None
    except tomllib.TOMLDecodeError as exc:
        line = _toml_line(str(exc))
        into.problem(relative, line, f"is not valid TOML: {exc}")
        return None
    except nesting.TooDeep as exc:
        into.problem(relative, None, f"is not valid TOML: {exc}")
        return None
    except UnicodeDecodeError:
        into.problem(relative, None, "is not UTF-8 text")
        return None
    except (FileNotFoundError, NotADirectoryError) as exc:
        into.problem(relative, None, f"cannot read: {exc.strerror}")
        return None
    except OSError as exc:  # permissions, I/O: the environment's problem, exit 8
        raise file_error(exc, "read", os.path.join(project_dir, relative)) from None
    into.files.append(relative)
    return data


def _toml_line(message: str) -> int | None:
    match = re.search(r"line (\d+)", message)
    return int(match[1]) if match else None


def line_of(project_dir: str, relative: str, needle: str) -> int | None:
    """The first line of the file that contains `needle` (for messages)."""
    try:
        text = read_project_file(project_dir, relative).decode("utf-8")
    except (OSError, NotAFile, UnicodeDecodeError):
        return None
    for number, line in enumerate(text.splitlines(), 1):
        if needle in line:
            return number
    return None


def where_in(project_dir: str, relative: str, needle: str) -> str:
    line = line_of(project_dir, relative, needle)
    return f"{relative}:{line}" if line else relative


def add_requirement(project_dir: str, relative: str, text: str, into: Collected) -> None:
    try:
        requirement = parse_requirement(text)
    except InvalidRequirement as exc:
        line = line_of(project_dir, relative, text)
        first = str(exc).splitlines()[0]
        into.problem(relative, line, f"'{text}' is not a valid requirement: {first}")
        return
    into.dependencies.append(Dependency(requirement, where_in(project_dir, relative, text)))


def build_requirements(project_dir: str, relative: str, data: dict[str, Any]) -> list[Dependency]:
    """``[build-system] requires``: not installed (the project is not built), but what it
    needs says which framework the project compiles against."""
    system = data.get("build-system")
    return _valid(project_dir, relative, system.get("requires") if isinstance(system, dict) else [])


def declared_requirements(
    project_dir: str, relative: str, data: dict[str, Any]
) -> list[Dependency]:
    """``[project] dependencies`` as written (a uv.lock may pin them differently, or
    override some away): what the project says it needs."""
    return _valid(project_dir, relative, table(data, "project").get("dependencies"))


def _valid(project_dir: str, relative: str, texts: object) -> list[Dependency]:
    """The valid requirements of a TOML list, each located at its line (anything but a
    list, such as a lone string, holds none): what detection reads, not what installs."""
    out = []
    for text in texts if isinstance(texts, list) else []:
        if isinstance(text, str):
            try:
                out.append(Dependency(Requirement(text), where_in(project_dir, relative, text)))
            except InvalidRequirement:
                continue
    return out


def _groups(data: dict[str, Any]) -> dict[str, list[Any]]:
    """Optional dependency groups and PEP 735 dependency groups, by normalized name, with
    every `{include-group = "NAME"}` replaced by that group's requirements."""
    project = table(data, "project")
    groups: dict[str, list[Any]] = {}
    for source in (project.get("optional-dependencies"), data.get("dependency-groups")):
        if isinstance(source, dict):
            for name, items in source.items():
                if isinstance(items, list):
                    groups.setdefault(normalize(str(name)), []).extend(items)
    return {name: _included(groups, name, ()) for name in groups}


def _selected(data: dict[str, Any], extras: tuple[str, ...]) -> set[str]:
    """The groups `extras` installs: those named, and those they include (PEP 735
    `{include-group}`), at any depth."""
    raw: dict[str, list[Any]] = {}
    for source in (
        table(data, "project").get("optional-dependencies"),
        data.get("dependency-groups"),
    ):
        if isinstance(source, dict):
            for name, items in source.items():
                if isinstance(items, list):
                    raw.setdefault(normalize(str(name)), []).extend(items)
    chosen: set[str] = set()
    pending = [normalize(e) for e in extras]
    while pending:
        name = pending.pop()
        if name in chosen:
            continue
        chosen.add(name)
        pending += [
            normalize(item["include-group"])
            for item in raw.get(name, [])
            if isinstance(item, dict) and isinstance(item.get("include-group"), str)
        ]
    return chosen


def _included(groups: dict[str, list[Any]], name: str, seen: tuple[str, ...]) -> list[Any]:
    """A group's requirement strings, its includes expanded (PEP 735; a cycle, or an
    include of a group that does not exist, adds nothing)."""
    out: list[Any] = []
    for item in groups.get(name, []):
        if isinstance(item, dict) and isinstance(item.get("include-group"), str):
            included = normalize(item["include-group"])
            if included not in seen and included != name:
                out += _included(groups, included, (*seen, name))
        else:
            out.append(item)
    return out


def read_pyproject(
    project_dir: str, relative: str, extras: tuple[str, ...], python: str | None, into: Collected
) -> None:
    """The dependencies pyproject.toml declares (and uv.lock pins), selected extras too."""
    data = load_toml(project_dir, relative, into)
    if data is None:
        return
    tool = table(data, "tool")
    poetry: dict[str, Any] | None = table(tool, "poetry") or None
    lock = os.path.join(os.path.dirname(relative), UV_LOCK)
    uv = table(tool, "uv")
    _uv_sources(project_dir, relative, uv, into)
    if os.path.isfile(os.path.join(project_dir, lock)):
        read_uv_lock(project_dir, lock, data, extras, python, into)
        return
    project = table(data, "project")
    for text in project.get("dependencies") or []:
        if isinstance(text, str):
            add_requirement(project_dir, relative, text, into)
    groups = _groups(data)
    unselected = sorted(set(groups) - _selected(data, extras))
    if unselected and poetry is None:
        frameworks = {name: _frameworks_in(groups[name]) for name in unselected}
        listed = ", ".join(
            f"{name} ({', '.join(found)})" if found else name for name, found in frameworks.items()
        )
        example = next((name for name, found in frameworks.items() if found), unselected[0])
        into.flag(
            where_in(project_dir, relative, "optional-dependencies")
            if "optional-dependencies" in table(data, "project")
            else where_in(project_dir, relative, "[dependency-groups]"),
            f"optional groups not installed: {listed}; name one in gpuenv.yaml's `extras:` "
            f"to install it (extras: [{example}])",
        )
    if poetry is not None:
        _poetry_sources(project_dir, relative, poetry, into)
        _poetry(project_dir, relative, poetry, extras, into)
        return
    for extra in extras:
        if extra not in groups:
            known = ", ".join(sorted(groups)) or "none"
            into.problem(
                relative,
                None,
                f"has no optional dependency group '{extra}' (it has: {known})",
            )
            continue
        for text in groups[extra]:
            if isinstance(text, str):
                add_requirement(project_dir, relative, text, into)


def _frameworks_in(items: list[Any]) -> list[str]:
    """The framework packages among a group's requirement strings (torch, jax, ...)."""
    found = []
    for text in items:
        if isinstance(text, str):
            try:
                name = normalize(Requirement(text).name)
            except InvalidRequirement:
                continue
            if name in FRAMEWORK_PACKAGES and name not in found:
                found.append(name)
    return found


def _poetry_sources(
    project_dir: str, relative: str, poetry: dict[str, Any], into: Collected
) -> None:
    """Poetry's [[tool.poetry.source]] indexes, reported as pip's and uv's are: one that
    serves framework builds is not used (the image's build is kept); another is named as
    not passed to the build (Poetry's priorities have no pip equivalent)."""
    for source in poetry.get("source") or []:
        if not isinstance(source, dict) or not isinstance(source.get("url"), str):
            continue
        name, url = str(source.get("name", "")), str(source["url"])
        where = where_in(project_dir, relative, url)
        if framework_index(url):
            into.flag(
                where,
                f"Poetry source {name} ({url}) serves framework builds for another CUDA: "
                "not used (the image's own framework build is kept)",
            )
        else:
            into.flag(
                where,
                f"Poetry source {name} ({url}): not passed to the build (Poetry's source "
                "priorities have no pip equivalent); add `--extra-index-url URL` to a "
                "requirements file named in `requirements:` if the build needs it",
            )


def _uv_sources(project_dir: str, relative: str, uv: dict[str, Any], into: Collected) -> None:
    indexes = {
        str(item.get("name")): str(item.get("url"))
        for item in uv.get("index", []) or []
        if isinstance(item, dict)
    }
    sources = table(uv, "sources")
    for package, entries in sources.items():
        for entry in entries if isinstance(entries, list) else [entries]:
            if not isinstance(entry, dict):
                continue
            url = indexes.get(str(entry.get("index")), "") or str(entry.get("url", ""))
            if url and framework_index(url):
                into.flag(
                    where_in(project_dir, relative, "[tool.uv.sources]"),
                    f"{package} from the uv index {url}: not used (framework builds for "
                    "another CUDA; the image's own build is kept)",
                )


def _poetry(
    project_dir: str,
    relative: str,
    poetry: dict[str, Any],
    extras: tuple[str, ...],
    into: Collected,
) -> None:
    main = table(poetry, "dependencies")
    wanted = set(extras)
    extra_names = {
        normalize(name): {normalize(p) for p in items if isinstance(p, str)}
        for name, items in (poetry.get("extras") or {}).items()
        if isinstance(items, list)
    }
    in_extras = set().union(*[extra_names.get(e, set()) for e in wanted]) if wanted else set()
    groups = {name: g for name, g in table(poetry, "group").items() if isinstance(g, dict)}
    for extra in extras:
        if extra not in extra_names and extra not in groups:
            known = ", ".join(sorted({*extra_names, *groups})) or "none"
            into.problem(
                relative,
                None,
                f"has no Poetry extra or group '{extra}' (it has: {known})",
            )
    # `poetry install` installs every group not marked optional; optional ones only when
    # named (gpuenv.yaml's `extras:`, as `poetry install --with`).
    unused = sorted(name for name in extra_names if name not in {normalize(e) for e in wanted})
    if unused:
        into.flag(
            where_in(project_dir, relative, "[tool.poetry.extras]"),
            f"Poetry extras not installed: {', '.join(unused)}; name one in gpuenv.yaml's "
            f"`extras:` to install it (extras: [{unused[0]}])",
        )
    left = sorted(n for n, g in groups.items() if g.get("optional") is True and n not in wanted)
    if left:
        into.flag(
            where_in(project_dir, relative, "[tool.poetry.group"),
            f"optional Poetry groups not installed: {', '.join(left)}; name one in "
            f"gpuenv.yaml's `extras:` to install it (extras: [{left[0]}])",
        )
    tables = [main] + [
        table(group, "dependencies")
        for name, group in groups.items()
        if name in wanted or group.get("optional") is not True
    ]
    for entries in tables:
        for name, value in entries.items():
            if normalize(name) == "python":
                continue
            optional = isinstance(value, dict) and value.get("optional") is True
            if optional and normalize(name) not in in_extras:
                continue
            text = poetry_requirement(name, value)
            if text is None:
                into.flag(
                    where_in(project_dir, relative, name),
                    f"{name}: a path or git dependency gpuenv does not install",
                )
                continue
            add_requirement(project_dir, relative, text, into)


def poetry_constraint(text: str) -> str:
    """A Poetry version constraint in PEP 440.

    >>> poetry_constraint("^2.3.0"), poetry_constraint("~1.2"), poetry_constraint("^0.2.3")
    ('>=2.3.0,<3.0.0', '>=1.2,<1.3.0', '>=0.2.3,<0.3.0')
    >>> poetry_constraint("2.3.1"), poetry_constraint("*"), poetry_constraint(">=1.0,<2")
    ('==2.3.1', '', '>=1.0,<2')
    """
    out = []
    for part in re.split(r"\s*,\s*|\s+(?=[<>=!^~])", text.strip()):
        part = part.strip()
        if part in ("", "*"):
            continue
        if part.startswith("^"):
            version = part[1:].strip()
            numbers = [int(n) for n in re.findall(r"\d+", version)[:3]]
            index = next((i for i, n in enumerate(numbers) if n != 0), len(numbers) - 1)
            upper = [*numbers[:index], numbers[index] + 1] + [0] * (2 - index)
            out.append(f">={version},<{'.'.join(map(str, upper[: max(3, index + 1)]))}")
        elif part.startswith("~") and not part.startswith("~="):
            version = part[1:].strip()
            numbers = [int(n) for n in re.findall(r"\d+", version)[:3]]
            upper = [numbers[0] + 1, 0, 0] if len(numbers) == 1 else [numbers[0], numbers[1] + 1, 0]
            out.append(f">={version},<{'.'.join(map(str, upper))}")
        elif re.match(r"^\d", part):
            out.append(f"=={part}")
        else:
            out.append(part)
    return ",".join(out)


def poetry_requirement(name: str, value: Any) -> str | None:
    """``torch = "^2.3.0"`` -> ``torch>=2.3.0,<3.0.0``; None for path/git entries."""
    extras = ""
    marker = ""
    if isinstance(value, dict):
        if any(key in value for key in ("path", "git", "url")):
            return None
        if isinstance(value.get("extras"), list):
            extras = "[" + ",".join(str(e) for e in value["extras"]) + "]"
        if isinstance(value.get("markers"), str):
            marker = f" ; {value['markers']}"
        value = value.get("version", "*")
    if isinstance(value, list):  # multiple constraints: the first (Poetry picks by marker)
        return poetry_requirement(name, value[0]) if value else name
    return f"{name}{extras}{poetry_constraint(str(value))}{marker}"


def read_uv_lock(
    project_dir: str,
    relative: str,
    pyproject: dict[str, Any],
    extras: tuple[str, ...],
    python: str | None,
    into: Collected,
) -> None:
    """Every package uv.lock pins for the project's own package (the one whose source is
    the project folder) and the selected extras and groups, with markers evaluated for an
    NGC image (Linux x86_64, the image's Python): what `uv export` would list."""
    data = load_toml(project_dir, relative, into)
    if data is None:
        return
    packages = [p for p in data.get("package", []) if isinstance(p, dict) and "name" in p]
    root_name = normalize(str((pyproject.get("project") or {}).get("name", "")))
    root = next((p for p in packages if normalize(p["name"]) == root_name), None)
    if root is None:
        root = next((p for p in packages if _is_project(p)), None)
    if root is None:
        into.problem(relative, None, "names no package for the project itself")
        return
    env = environment(python)
    encoded = {
        e: f"extra-{len(normalize(root['name']))}-{normalize(root['name'])}-{e}" for e in extras
    }
    pinned: set[tuple[str, str]] = set()
    visited: set[tuple[tuple[str, str], tuple[str, ...]]] = set()
    queue = [(root, tuple(extras))]
    while queue:
        package, selected = queue.pop(0)
        edges = list(package.get("dependencies", []) or [])
        for extra in selected:
            edges += (package.get("optional-dependencies") or {}).get(extra, []) or []
            edges += (package.get("dev-dependencies") or {}).get(extra, []) or []
        for edge in edges:
            if not isinstance(edge, dict) or not _marker_holds(edge.get("marker"), env, encoded):
                continue
            target = _find(packages, edge)
            if target is None or _is_project(target):
                continue
            key = (normalize(target["name"]), str(target.get("version", "")))
            if key not in pinned:
                pinned.add(key)
                _uv_pin(target, relative, into)
            state = (key, tuple(normalize(e) for e in edge.get("extra", []) or []))
            # A framework's own dependencies (PyPI torch's nvidia-*-cu12 wheels, triton)
            # come with NVIDIA's build in the image: never followed.
            if state not in visited and key[0] not in FRAMEWORK_OR_COUPLED:
                visited.add(state)
                queue.append((target, state[1]))


def _is_project(package: dict[str, Any]) -> bool:
    source = package.get("source")
    return isinstance(source, dict) and ("editable" in source or "virtual" in source)


def _find(packages: list[dict[str, Any]], edge: dict[str, Any]) -> dict[str, Any] | None:
    name = normalize(str(edge.get("name")))
    matching = [p for p in packages if normalize(p["name"]) == name]
    if "version" in edge:
        matching = [p for p in matching if p.get("version") == edge["version"]] or matching
    if "source" in edge:
        matching = [p for p in matching if p.get("source") == edge["source"]] or matching
    return matching[0] if matching else None


def _marker_holds(text: Any, env: dict[str, str], encoded: dict[str, str]) -> bool:
    if not isinstance(text, str):
        return True
    try:
        marker = Marker(text)
    except InvalidMarker:
        return True
    # uv encodes conflicting extras as `extra == 'extra-N-project-name'`.
    values = list(encoded.values()) or [""]
    return any(marker.evaluate({**env, "extra": value}) for value in values)


def _uv_pin(package: dict[str, Any], relative: str, into: Collected) -> None:
    name, version = str(package["name"]), str(package.get("version", ""))
    source = table(package, "source")
    where = f"{relative} ({name} {version})"
    registry = str(source.get("registry", ""))
    if registry and framework_index(registry):
        into.flag(
            where,
            f"pinned from {registry}: not used (framework builds for another "
            "CUDA); the version pin is kept",
        )
    if "git" in source:
        text = f"{name} @ git+{source['git']}"
    elif "url" in source:
        text = f"{name} @ {source['url']}"
    elif version:
        text = f"{name}=={version}"
    else:
        text = name
    hashes = tuple(
        str(item["hash"]).removeprefix("sha256:")
        for item in [*(package.get("wheels") or []), package.get("sdist") or {}]
        if isinstance(item, dict) and str(item.get("hash", "")).startswith("sha256:")
    )
    try:
        into.dependencies.append(Dependency(Requirement(text), where, hashes=hashes))
    except InvalidRequirement:
        into.flag(where, f"'{text}' is not a requirement pip can read: not installed")
