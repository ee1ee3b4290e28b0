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

from gpuenv.errors import LockError, ResolutionError
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
    direct: bool = False  # required by URL (`NAME @ URL`): installed from that URL

    @property
    def file(self) -> str:
        return urlsplit(self.url).path.rsplit("/", 1)[-1]

    @property
    def sdist(self) -> bool:
        return self.file.endswith(SDIST_SUFFIXES)

    def pin(self) -> str:
        return f"{self.name}=={self.version}"

    def line(self) -> str:
        """The line a build installs: ``NAME==VERSION --hash=sha256:HEX`` (``NAME @ URL
        --hash=...`` for a package the project required by URL)."""
        if self.direct:
            return f"{self.name} @ {self.url} --hash=sha256:{self.sha256}"
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
        if self.direct:
            data["direct"] = True
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
    exclude_newer: str = ""  # resolved as of this UTC time (files uploaded before it)

    def get(self, name: str) -> LockedPackage | None:
        return next((p for p in self.packages if p.name == name), None)

    def group(self, group: str) -> tuple[LockedPackage, ...]:
        return tuple(p for p in self.packages if p.group == group)

    def to_data(self) -> dict[str, Any]:
        if not self.resolved:
            cutoff = {"exclude_newer": self.exclude_newer} if self.exclude_newer else {}
            return {"resolved": False, "note": self.note, **cutoff}
        return {
            "resolved": True,
            "sources": dict(sorted(self.sources.items())),
            "base": self.base.to_data() if self.base is not None else None,
            "options": list(self.options),
            "packages": [p.to_data() for p in self.packages],
            **({"paths": list(self.paths)} if self.paths else {}),
            **({"exclude_newer": self.exclude_newer} if self.exclude_newer else {}),
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


PYPI = "https://pypi.org/simple/"
PYPI_FILES = "files.pythonhosted.org"


def index_of(url: str, options: Iterable[str]) -> str:
    """The index (or find-links place) a file's URL came through: the one that shares
    its host (PyPI's for PyPI's file host, when PyPI is among them); "" when none does.

    >>> index_of("https://files.pythonhosted.org/p/x.whl", ["--extra-index-url=https://i/s/"])
    'https://pypi.org/simple/'
    >>> index_of("https://other.example/x.whl", ["--index-url=https://i/s/"])
    ''
    """
    given = [o.split("=", 1) for o in options if "=" in o]
    indexes = [v for k, v in given if k == "--index-url"]
    if "--no-index" not in options and not indexes:
        indexes = [PYPI]
    places = indexes + [v for k, v in given if k in ("--extra-index-url", "--find-links")]
    host = urlsplit(url).netloc
    for place in places:
        if host == PYPI_FILES and place == PYPI:
            return place
        if urlsplit(place).netloc == host and (host or url.startswith("file:")):
            return place
    return ""


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
    where = _mapping(report.get("where"))
    packages: list[LockedPackage] = []
    refused: list[Unlockable] = []
    items = report.get("packages")
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            raise ResolutionError(f"the resolver reported a package that is not one: {item!r}")
        name = normalize(str(item.get("name") or ""))
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
            package = LockedPackage(
                name,
                str(item.get("version") or ""),
                sha,
                url,
                index_of(url, kept),
                group if group in GROUPS else "install",
                direct=item.get("direct") is True,
            )
            problem = package_problem(package)
            if problem:
                raise ResolutionError(f"the resolver reported {problem}")
            packages.append(package)
    inventory = _mapping(report.get("inventory"))
    count, digest = inventory.get("count"), str(inventory.get("digest") or "")
    if not isinstance(count, int) or not _INVENTORY.match(digest):
        raise ResolutionError("the resolver reported no inventory of the base image")
    base = Base(
        count,
        digest,
        {str(k): str(v) for k, v in _mapping(report.get("constraint_files")).items()},
        str(report.get("python") or ""),
        str(report.get("pip") or ""),
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
    cutoff = str(data.get("exclude_newer") or "")
    if cutoff and not _CUTOFF.match(cutoff):
        raise _damaged(where, f"'overlay.exclude_newer' is not a UTC time ({cutoff!r})")
    if not data["resolved"]:
        return Overlay(False, note=str(data.get("note") or ""), exclude_newer=cutoff)
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
    if any(not isinstance(p, str) or not _PATH.match(p) or "/.." in p for p in paths):
        raise _damaged(where, "'overlay' has a path that is not a folder below /workspace")
    if any(not isinstance(o, str) or not _OPTION.match(o) for o in options):
        raise _damaged(where, "'overlay' has an option gpuenv does not pass to an installer")
    packages = tuple(_package(item, where) for item in items)
    return Overlay(
        True,
        packages,
        tuple(str(o) for o in options),
        _base(base, where),
        sources={str(k): str(v) for k, v in sources.items()},
        paths=tuple(str(path) for path in paths),
        exclude_newer=cutoff,
    )


def _base(base: dict[str, Any] | None, where: str) -> Base | None:
    if base is None:
        return None
    count, inventory = base.get("python_distributions"), str(base.get("inventory") or "")
    if not isinstance(count, int) or not _INVENTORY.match(inventory):
        raise _damaged(where, "'overlay.base' lacks its count or its inventory digest")
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
    name, version, sha, url, index, group = (
        str(item.get(k) or "") for k in ("name", "version", "sha256", "url", "index", "group")
    )
    package = LockedPackage(
        name, version, sha, url, index, group or "install", direct=item.get("direct") is True
    )
    problem = package_problem(package)
    if problem:
        raise _damaged(where, problem)
    return package


# What a lock may hold, since its values reach files a build reads (overlay.txt, a .pth):
# a name as PEP 508 spells one, a version PEP 440 reads, a URL of one line and no spaces,
# index options from a short list, project folders below /workspace.
_NAME = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$")
_URL = re.compile(r"^(https?|file)://[^\s\x00-\x1f\x7f]+$")
_OPTION = re.compile(
    r"^(--(index-url|extra-index-url|find-links|trusted-host|only-binary|no-binary)="
    r"[^\s\x00-\x1f\x7f]+|--no-index|--pre|--prefer-binary)$"
)
_PATH = re.compile(r"^/workspace(/[A-Za-z0-9_.+-]+)*$")
_INVENTORY = re.compile(r"^sha256:[0-9a-f]{64}$")
_CUTOFF = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")


def cutoff_time(text: str) -> str:
    """`--exclude-newer`'s value as the UTC time pip reads: a date (its midnight, UTC) or
    a time in UTC. ValueError for anything else.

    >>> cutoff_time("2026-01-31"), cutoff_time("2026-01-31T08:30:00Z")
    ('2026-01-31T00:00:00Z', '2026-01-31T08:30:00Z')
    """
    from datetime import UTC, datetime

    for layout in ("%Y-%m-%d", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            moment = datetime.strptime(text.strip(), layout).replace(tzinfo=UTC)
        except ValueError:
            continue
        return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
    raise ValueError(f"{text!r} is not a date (2026-01-31) or a UTC time (2026-01-31T08:30:00Z)")


def package_problem(package: LockedPackage) -> str | None:
    """What makes a locked package unfit to install (None: nothing)."""
    from packaging.version import InvalidVersion, Version

    label = package.name or "?"
    if not _NAME.match(package.name):
        return f"a package named {package.name!r}, which is not a package name"
    try:
        Version(package.version)
    except InvalidVersion:
        return f"package {label} at version {package.version!r}, which is not a version"
    if not _SHA256.match(package.sha256):
        return f"package {label} without a sha256"
    if package.url and not _URL.match(package.url):
        return f"package {label} from {package.url!r}, which is not a URL gpuenv installs from"
    if package.direct and not package.url:
        return f"package {label}, required by URL, without its URL"
    if package.group not in GROUPS:
        return f"package {label} in no known group ({package.group})"
    return None


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _damaged(where: str, what: str) -> LockError:
    return LockError(
        f"{where} is damaged: {what}",
        hint="run `gpuenv lock` to write it again from gpuenv.yaml",
    )
