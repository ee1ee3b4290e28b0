"""The overlay: every Python distribution a build installs on top of the locked base, as
gpuenv.lock pins it (exact version, the sha256 of the file, where it came from), and
what the base itself holds (a count and a digest of its distributions).

Pure data: the resolver's report (images/ngc/files/install.py --resolve, pip's
`install --dry-run --report` run in the pinned base) comes in as JSON and leaves as an
`Overlay`; builds install exactly `requirement_lines()`, hashes required, nothing
resolved. Nothing here talks to an engine.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from gpuenv.errors import LockError
from gpuenv.project.packages import normalize

GROUPS = ("install", "companion", "late")  # as install.py installs them, in that order
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
SDIST_SUFFIXES = (".tar.gz", ".zip", ".tar.bz2", ".tgz")


@dataclass(frozen=True)
class LockedPackage:
    """One distribution of the overlay, to the byte."""

    name: str
    version: str
    sha256: str
    url: str  # the file's URL, as the resolver downloaded it (no credentials)
    index: str = ""  # the index (or find-links) option it came through
    group: str = "install"  # install | companion (no dependencies) | late (no isolation)

    @property
    def file(self) -> str:
        return urlsplit(self.url).path.rsplit("/", 1)[-1]

    @property
    def sdist(self) -> bool:
        return self.file.endswith(SDIST_SUFFIXES)

    def pin(self) -> str:
        return f"{self.name}=={self.version}"

    def line(self) -> str:
        """The line a build installs: ``NAME==VERSION --hash=sha256:HEX``."""
        return f"{self.pin()} --hash=sha256:{self.sha256}"

    def to_data(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": self.name,
            "version": self.version,
            "sha256": self.sha256,
            "url": self.url,
            "index": self.index,
        }
        if self.group != "install":
            data["group"] = self.group
        return data


@dataclass(frozen=True)
class Base:
    """What the pinned base holds: its Python distributions (count, and a digest of the
    sorted `name==version` list, NVIDIA's local versions included), its pip constraint
    files (path -> sha256) and its Python and pip."""

    distributions: int
    inventory: str
    constraint_files: dict[str, str] = field(default_factory=dict)
    python: str = ""
    pip: str = ""

    def to_data(self) -> dict[str, Any]:
        return {
            "python_distributions": self.distributions,
            "inventory": self.inventory,
            "constraint_files": dict(sorted(self.constraint_files.items())),
            "python": self.python,
            "pip": self.pip,
        }


@dataclass(frozen=True)
class Overlay:
    """The lock's `overlay` section. `resolved` False: written without an engine (or
    before this gpuenv); builds and `lock --check` then ask for `gpuenv lock`."""

    resolved: bool
    packages: tuple[LockedPackage, ...] = ()
    options: tuple[str, ...] = ()  # the index options the files came through
    base: Base | None = None
    note: str = ""  # why it is not resolved
    sources: dict[str, str] = field(default_factory=dict)  # file -> its sha256 when resolved
    paths: tuple[str, ...] = ()  # the project's folders on the path in runs (`-e .`)

    def get(self, name: str) -> LockedPackage | None:
        return next((p for p in self.packages if p.name == name), None)

    def group(self, group: str) -> tuple[LockedPackage, ...]:
        return tuple(p for p in self.packages if p.group == group)

    def to_data(self) -> dict[str, Any]:
        if not self.resolved:
            return {"resolved": False, "note": self.note}
        return {
            "resolved": True,
            "sources": dict(sorted(self.sources.items())),
            "base": self.base.to_data() if self.base is not None else None,
            "options": list(self.options),
            "packages": [p.to_data() for p in self.packages],
            **({"paths": list(self.paths)} if self.paths else {}),
        }


UNRESOLVED = Overlay(False, note="not resolved yet: run `gpuenv lock` where an engine runs")
NOTHING = Overlay(True)  # a project that installs no Python package


def without_credentials(url: str) -> str:
    """A URL with any user information removed (never written into a lock or image).

    >>> without_credentials("https://ann:tok@idx.example/simple/x.whl")
    'https://idx.example/simple/x.whl'
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if not (parts.username or parts.password):
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def index_of(url: str, options: Iterable[str]) -> str:
    """The index option a file's URL came through: the option whose URL shares the
    file's scheme and host (the first such), else the only one, else PyPI's default."""
    places = [o.split("=", 1)[1] for o in options if o.startswith(("--index-url=", "--extra-"))]
    places += [o.split("=", 1)[1] for o in options if o.startswith("--find-links=")]
    try:
        host = urlsplit(url).netloc
    except ValueError:
        host = ""
    for place in places:
        if urlsplit(place).netloc == host and (host or place.startswith("/") or url[:5] == "file:"):
            return place
    if not places:
        return "https://pypi.org/simple/"
    return places[0]


@dataclass(frozen=True)
class Unlockable:
    """A requirement that cannot be pinned to the byte, with why and what to do."""

    name: str
    where: str
    reason: str

    def __str__(self) -> str:
        return f"{self.name} ({self.where}): {self.reason}"


def overlay_from_report(
    report: Mapping[str, Any], options: Iterable[str], sources: Mapping[str, str]
) -> tuple[Overlay, list[Unlockable]]:
    """The overlay install.py --resolve found, and what in it cannot be locked."""
    kept = tuple(o for o in options if o.startswith("--"))
    where = report.get("where") or {}
    packages: list[LockedPackage] = []
    refused: list[Unlockable] = []
    for item in report.get("packages") or []:
        name = normalize(str(item.get("name", "")))
        place = str(where.get(name, "a dependency"))
        sha = str(item.get("sha256") or "")
        if item.get("vcs"):
            refused.append(
                Unlockable(
                    name,
                    place,
                    f"a {item['vcs']} requirement has no file to hash (pip's hash mode "
                    "refuses them): publish a wheel of it (`pip wheel` at a commit) to an "
                    "index or a find-links folder of the project, and require NAME==VERSION",
                )
            )
        elif item.get("directory"):
            refused.append(
                Unlockable(
                    name,
                    place,
                    "a local folder is not a file gpuenv can pin: the project is mounted at "
                    "/workspace when it runs",
                )
            )
        elif not _SHA256.match(sha):
            refused.append(
                Unlockable(
                    name,
                    place,
                    f"{without_credentials(str(item.get('url', '')))} gave no sha256 and "
                    "could not be read to compute one",
                )
            )
        else:
            url = without_credentials(str(item.get("url", "")))
            group = str(item.get("group", "install"))
            packages.append(
                LockedPackage(
                    name,
                    str(item.get("version", "")),
                    sha,
                    url,
                    index_of(url, kept),
                    group if group in GROUPS else "install",
                )
            )
    inventory = report.get("inventory") or {}
    base = Base(
        int(inventory.get("count", 0)),
        str(inventory.get("digest", "")),
        {str(k): str(v) for k, v in (report.get("constraint_files") or {}).items()},
        str(report.get("python", "")),
        str(report.get("pip", "")),
    )
    ordered = tuple(sorted(packages, key=lambda p: (GROUPS.index(p.group), p.name)))
    return Overlay(True, ordered, kept, base, sources=dict(sources)), refused


def sdist_notes(overlay: Overlay) -> list[str]:
    """A line for each source distribution: its bytes are pinned, its build is not."""
    return [
        f"{p.pin()} is a source distribution ({p.file}): its bytes are pinned, but what it "
        f"builds into is not (a compiler, a build dependency can change it); to pin that "
        f"too, build a wheel (`pip wheel --no-deps {p.pin()}`) and serve it from an index or a "
        "find-links folder of the project"
        for p in overlay.packages
        if p.sdist
    ]


def changes(old: Overlay | None, new: Overlay) -> list[str]:
    """What a re-lock changed, one line each: `+ name version`, `- name version`,
    `~ name old → new` (a file that changed under the same version is `~ name version
    (another file)`)."""
    before = {p.name: p for p in old.packages} if old is not None and old.resolved else {}
    after = {p.name: p for p in new.packages}
    out = []
    for name in sorted(set(before) | set(after)):
        was, now = before.get(name), after.get(name)
        if was is None and now is not None:
            out.append(f"+ {name} {now.version}")
        elif now is None and was is not None:
            out.append(f"- {name} {was.version}")
        elif was is not None and now is not None:
            if was.version != now.version:
                out.append(f"~ {name} {was.version} → {now.version}")
            elif was.sha256 != now.sha256:
                out.append(f"~ {name} {now.version} (another file: sha256:{now.sha256[:12]}…)")
    return out


def overlay_from_data(data: Any, where: str) -> Overlay:
    """The lock's `overlay` section; LockError when it is damaged."""
    if data is None:
        return Overlay(False, note="written by a gpuenv that did not lock the overlay")
    if not isinstance(data, dict) or not isinstance(data.get("resolved"), bool):
        raise _damaged(where, "'overlay' is not a mapping with 'resolved'")
    if not data["resolved"]:
        return Overlay(False, note=str(data.get("note") or ""))
    base = data.get("base")
    items = data.get("packages")
    options = data.get("options") or []
    if not isinstance(base, dict | None) or not isinstance(items, list):
        raise _damaged(where, "'overlay' lacks 'base' or 'packages'")
    if not isinstance(options, list):
        raise _damaged(where, "'overlay' has 'options' that are not a list")
    sources = data.get("sources") or {}
    paths = data.get("paths") or []
    if not isinstance(sources, dict) or not isinstance(paths, list):
        raise _damaged(where, "'overlay' has 'sources' or 'paths' of the wrong kind")
    if any(not str(path).startswith("/workspace") or "\n" in str(path) for path in paths):
        raise _damaged(where, "'overlay' has a path outside /workspace")
    packages = tuple(_package(item, where) for item in items)
    return Overlay(
        True,
        packages,
        tuple(str(o) for o in options),
        _base(base),
        sources={str(k): str(v) for k, v in sources.items()},
        paths=tuple(str(path) for path in paths),
    )


def _base(base: dict[str, Any] | None) -> Base | None:
    if base is None:
        return None
    files = base.get("constraint_files") or {}
    return Base(
        int(base.get("python_distributions") or 0),
        str(base.get("inventory") or ""),
        {str(k): str(v) for k, v in files.items()} if isinstance(files, dict) else {},
        str(base.get("python") or ""),
        str(base.get("pip") or ""),
    )


def _package(item: Any, where: str) -> LockedPackage:
    if not isinstance(item, dict):
        raise _damaged(where, "an overlay package is not a mapping")
    name, version, sha = (str(item.get(k) or "") for k in ("name", "version", "sha256"))
    if not name or not version or not _SHA256.match(sha):
        raise _damaged(where, f"overlay package {name or '?'} lacks a version or a sha256")
    group = str(item.get("group") or "install")
    if group not in GROUPS:
        raise _damaged(where, f"overlay package {name} is in no known group ({group})")
    return LockedPackage(
        name, version, sha, str(item.get("url") or ""), str(item.get("index") or ""), group
    )


def _damaged(where: str, what: str) -> LockError:
    return LockError(
        f"{where} is damaged: {what}",
        hint="run `gpuenv lock` to write it again from gpuenv.yaml",
    )
