"""A project's dependency sources read into located requirements: requirements files with
their -r/-c includes (this module), pyproject.toml, uv.lock and environment.yml
(`gpuenv.project.pyproject`).

Every requirement keeps where it was written (``requirements.txt:3``), so that what gpuenv
decides about it (left to the image, installed, flagged) can say so. A file gpuenv cannot
follow (an include outside the project, a missing one, a line pip could not parse) is a
located SpecError (exit 3), never a silent drop.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from urllib.parse import unquote, urlsplit

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from gpuenv.common.files import NotAFile, read_capped
from gpuenv.errors import Problem, SpecError, file_error
from gpuenv.project.packages import framework_index, normalize
from gpuenv.project.spec import inside_project

# The Linux environment NGC images are: markers are evaluated against it (the Python
# version is the image's when known, see `environment`).
LINUX = {
    "os_name": "posix",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "platform_python_implementation": "CPython",
    "implementation_name": "cpython",
}
# pip options that are safe to pass on (they select where and how packages come from).
_KEPT_OPTIONS = (
    "--pre",
    "--no-index",
    "--prefer-binary",
    "--only-binary",
    "--no-binary",
    "--trusted-host",
)
# Where pip looks for packages: each spelling -> the long option passed on.
_INDEX_OPTIONS = {
    "-i": "--index-url",
    "--index-url": "--index-url",
    "--extra-index-url": "--extra-index-url",
    "-f": "--find-links",
    "--find-links": "--find-links",
}
_INCLUDE_OPTIONS = {"-r": False, "--requirement": False, "-c": True, "--constraint": True}
OPTION = re.compile(r"^(-[a-zA-Z]|--[a-z-]+)(?:[ =]\s*(.*))?$")
_WHEEL_VERSION = re.compile(r"/(?P<name>[A-Za-z0-9_.]+)-(?P<version>[0-9][^-/]*)-[^/]*\.whl$")


@dataclass(frozen=True)
class Dependency:
    """One requirement of the project, as written, and where."""

    requirement: Requirement
    where: str  # "requirements.txt:3"
    constraint: bool = False  # from a -c file: limits versions, installs nothing
    hashes: tuple[str, ...] = ()  # the sha256 values the project allows (--hash, uv.lock)

    @property
    def name(self) -> str:
        return normalize(self.requirement.name)

    @property
    def specifier(self) -> str:
        """The version specifier; for a wheel URL, ``==`` the version in its file name."""
        if self.requirement.url:
            match = _WHEEL_VERSION.search(self.requirement.url)
            try:  # the release a wheel is a build of: torch-2.3.0+cu121 -> ==2.3.0
                return f"=={Version(unquote(match['version'])).public}" if match else ""
            except InvalidVersion:
                return ""
        return str(self.requirement.specifier)

    def applies(self, environment: dict[str, str]) -> bool:
        marker = self.requirement.marker
        return marker is None or marker.evaluate({**environment, "extra": ""})

    def line(self) -> str:
        return str(self.requirement)


@dataclass(frozen=True)
class Flag:
    """Something gpuenv read and will not do as written, with why."""

    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


@dataclass
class Collected:
    """What the sources say: requirements, pip options kept, flags, and every file read."""

    dependencies: list[Dependency] = field(default_factory=list)
    options: list[str] = field(default_factory=list)
    flags: list[Flag] = field(default_factory=list)
    files: list[str] = field(default_factory=list)  # relative paths, in reading order
    problems: list[Problem] = field(default_factory=list)
    conda: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (version, where)
    # conda framework packages (jax=0.4.26) as the pip pins they mean (jax==0.4.26.*):
    # not installed (the image has NVIDIA's build), but they steer the image choice
    conda_pins: list[Dependency] = field(default_factory=list)
    require_hashes: list[str] = field(default_factory=list)  # where --require-hashes was said
    # Folders of the project named as requirements (`-e .`, `.[dev]`, `./sub`): relative
    # path -> (where, extras); their declared dependencies are read (the extras' too),
    # and they are on the path in runs.
    local_projects: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    run_paths: list[str] = field(default_factory=list)  # where those are in a run
    cpu_index_files: set[str] = field(default_factory=set)  # files naming a CPU wheel index

    def problem(self, file: str, line: int | None, message: str) -> None:
        """A problem at a line of a dependency file (or the whole file: `line` None)."""
        self.problems.append(Problem(file, line, None, None, message))

    def flag(self, where: str, message: str) -> None:
        if all(f.where != where or f.message != message for f in self.flags):
            self.flags.append(Flag(where, message))

    def raise_problems(self) -> None:
        if self.problems:
            fix = (
                "fix the file at that line"
                if all(p.line for p in self.problems)
                else "make it a readable file, or drop it from `requirements:` in gpuenv.yaml "
                "(or the -r line that includes it)"
            )
            raise SpecError(
                self.problems, hint=f"{fix} (gpuenv reads every requirement it installs)"
            )


def environment(python: str | None) -> dict[str, str]:
    """Marker values for an NGC image with this Python (``3.12``; 3.12 when unknown)."""
    version = python or "3.12"
    parts = version.split(".")
    short = ".".join(parts[:2])
    full = version if len(parts) >= 3 else f"{short}.0"
    return {**LINUX, "python_version": short, "python_full_version": full}


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) with comments removed and continuations joined."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = "" if raw.lstrip().startswith("#") else raw
        line = re.split(r"(^|\s)#", line, maxsplit=1)[0].rstrip()
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        pending += line
        if pending.strip():
            out.append((start, pending.strip()))
        pending = ""
    if pending.strip():
        out.append((start, pending.strip()))
    return out


_HASH = re.compile(r"--hash[= ]\s*(\S+)")


def line_hashes(line: str) -> tuple[tuple[str, ...], list[str]]:
    """The sha256 values of a line's ``--hash`` options, and those gpuenv cannot check.

    >>> line_hashes("six==1.16.0 --hash=sha256:" + "a" * 64 + " --hash=md5:00")[1]
    ['md5:00']
    """
    good, bad = [], []
    for value in _HASH.findall(line):
        algorithm, _, digest = value.partition(":")
        if algorithm == "sha256" and re.fullmatch(r"[0-9a-f]{64}", digest):
            good.append(digest)
        else:
            bad.append(value)
    return tuple(good), bad


# `git+https://host/repo.git@v1#egg=name`: the legacy way to name a URL's package
_EGG = re.compile(
    r"^(?P<url>(?:(?:git|hg|svn|bzr)\+)?[a-z][a-z0-9+.-]*://[^\s#]+)"
    r"#(?:.*&)?egg=(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)"
)


def parse_requirement(text: str) -> Requirement:
    """A PEP 508 requirement from a requirements-file line, without per-line options
    (``--hash=...``, ``--config-settings``); InvalidRequirement when pip could not read it
    either (``torch==``)."""
    cleaned = re.sub(r"\s--?[a-z][a-z-]*(=\S+|\s+\S+)?", "", f" {text}").strip()
    if not cleaned:
        raise InvalidRequirement(f"'{text}' names no package")
    egg = _EGG.match(cleaned)
    if egg:
        raise InvalidRequirement(
            "it names its package the legacy way (#egg=), which gpuenv does not read: "
            f"write it as PEP 508 has it, '{egg['name']} @ {egg['url']}'"
        )
    return Requirement(cleaned)


def read_project_file(project_dir: str, relative: str) -> bytes:
    """A file of the project, read as `read_capped` reads (no named pipe, no device, no
    endless file); a link that leads out of the project folder is refused, so no message
    ever quotes a file outside it. NotAFile says why; OSError as `open` raises it."""
    if not inside_project(project_dir, relative):
        target = os.path.realpath(os.path.join(project_dir, relative))
        raise NotAFile(
            f"is a link to {target}, outside the project folder: gpuenv reads only the "
            "project's own files (copy that file into the project)"
        )
    return read_capped(os.path.join(project_dir, relative))


def read_requirements_file(project_dir: str, relative: str, into: Collected) -> None:
    """Read `relative` and everything it includes into `into` (problems collected)."""
    _read(project_dir, PurePosixPath(relative).as_posix(), into, constraint=False, chain=())


def _read(
    project_dir: str, relative: str, into: Collected, *, constraint: bool, chain: tuple[str, ...]
) -> None:
    if relative in into.files:
        return
    path = os.path.join(project_dir, relative)
    try:
        # A byte-order mark (Windows editors write one) is read past, as pip does.
        text = read_project_file(project_dir, relative).decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError:
        into.problem(relative, None, "is not UTF-8 text")
        return
    except NotAFile as exc:
        into.problem(relative, None, str(exc))
        return
    except (FileNotFoundError, NotADirectoryError) as exc:
        into.problem(relative, None, f"cannot read: {exc.strerror or exc}")
        return
    except OSError as exc:  # permissions, I/O: the environment's problem, exit 8
        raise file_error(exc, "read", path) from None
    into.files.append(relative)
    for number, line in _logical_lines(text):
        where = f"{relative}:{number}"
        option = OPTION.match(line) if line.startswith("-") else None
        if option:
            read_option(
                project_dir,
                relative,
                number,
                option[1],
                (option[2] or "").strip(),
                into,
                constraint=constraint,
                chain=(*chain, relative),
            )
            continue
        if _is_local_path(line):
            _local(project_dir, relative, number, line, into)
            continue
        try:
            requirement = parse_requirement(line)
        except InvalidRequirement as exc:
            first = str(exc).splitlines()[0]
            into.problem(relative, number, f"'{line}' is not a valid requirement: {first}")
            continue
        if requirement.url and _credentials(requirement.url):
            into.problem(
                relative,
                number,
                f"{requirement.name} @ {_masked(requirement.url)} carries a user name or token "
                "in its URL, which would be written into gpuenv.lock and the image: serve the "
                "file from an index without credentials in its URL",
            )
            continue
        hashes, wrong = line_hashes(line)
        for text in wrong:
            into.problem(
                relative,
                number,
                f"--hash={text}: gpuenv checks sha256 hashes (sha256:<64 hex digits>)",
            )
        into.dependencies.append(Dependency(requirement, where, constraint, hashes))


def _is_local_path(line: str) -> bool:
    return line.startswith((".", "/", "~")) or line.startswith("file:")


def read_option(
    project_dir: str,
    relative: str,
    number: int,
    name: str,
    value: str,
    into: Collected,
    *,
    constraint: bool,
    chain: tuple[str, ...],
) -> None:
    """One pip option line: an include is read, an index kept (or flagged), ``-e`` taken
    as a requirement, a safe option passed on; any other option is a problem."""
    if name in _INCLUDE_OPTIONS:
        _include(
            project_dir,
            relative,
            number,
            value,
            into,
            constraint=constraint or _INCLUDE_OPTIONS[name],
            chain=chain,
        )
    elif name in _INDEX_OPTIONS:
        _index_option(relative, number, name, value, into)
    elif name in ("-e", "--editable"):
        _editable(project_dir, relative, number, value, into, constraint=constraint)
    elif name == "--require-hashes":
        # Every requirement must then carry its hashes (pip's rule); gpuenv checks each
        # file it locks against them, and builds always require the lock's hashes.
        into.require_hashes.append(f"{relative}:{number}")
    elif name in _KEPT_OPTIONS:
        into.options.append(f"{name}={value}" if value else name)
    else:
        into.problem(
            relative,
            number,
            f"pip option {name} is not supported in requirements gpuenv installs",
        )


def _index_option(relative: str, number: int, name: str, value: str, into: Collected) -> None:
    """An index or find-links URL: kept for pip, unless it carries credentials (a problem)
    or serves framework builds (flagged: the image's own build is kept)."""
    if _credentials(value):
        # Written into the image's install.txt, it would ship (and be pushed) with it.
        into.problem(
            relative,
            number,
            f"{name} {_masked(value)} carries a user name or token in its URL, which "
            "would be written into the image (and pushed with it): remove the "
            "credentials from the URL; gpuenv cannot pass index credentials to a build "
            "without writing them into the image yet",
        )
    elif framework_index(value):
        if value.rstrip("/").endswith("/cpu"):
            into.cpu_index_files.add(relative)
        into.flag(
            f"{relative}:{number}",
            f"{name} {value} serves framework builds for another CUDA: not used "
            "(the image's own framework build is kept)",
        )
    else:
        into.options.append(f"{_INDEX_OPTIONS[name]}={value}")


def _editable(
    project_dir: str, relative: str, number: int, value: str, into: Collected, *, constraint: bool
) -> None:
    """``-e``: a folder of the project is the project (`_local`); a VCS or URL
    requirement is installed when its package name can be told."""
    where = f"{relative}:{number}"
    if _is_local_path(value):
        _local(project_dir, relative, number, value, into)
        return
    try:
        requirement = parse_requirement(_egg_requirement(value))
    except InvalidRequirement:
        into.problem(
            relative,
            number,
            f"-e {value}: gpuenv cannot tell which package this is "
            "(add #egg=NAME or write NAME @ URL)",
        )
        return
    into.dependencies.append(Dependency(requirement, where, constraint))


def _local(project_dir: str, relative: str, number: int, value: str, into: Collected) -> None:
    """A local path as a requirement: a folder of the project with a pyproject.toml is
    the project (or a package of it): its dependencies are read (by the caller) and it
    is importable in runs; anything else is named and not installed."""
    where = f"{relative}:{number}"
    text, _, extras = value.removeprefix("file:").split("#", 1)[0].strip().partition("[")
    folder = os.path.normpath((PurePosixPath(relative).parent / text).as_posix())
    if (
        not text.startswith(("/", "~"))
        and re.fullmatch(r"[A-Za-z0-9_.+/-]+", folder)
        and inside_project(project_dir, folder)
        and os.path.isfile(os.path.join(project_dir, folder, "pyproject.toml"))
    ):
        chosen = tuple(normalize(e) for e in extras.rstrip("]").split(",") if e.strip())
        into.local_projects.setdefault(PurePosixPath(folder).as_posix(), (where, chosen))
        return
    into.flag(
        where,
        f"'{value}' is a local path gpuenv does not install (only a folder of the project "
        "with a pyproject.toml is read: its dependencies are installed, and it is on the "
        "path at /workspace when it runs)",
    )


def _egg_requirement(value: str) -> str:
    """``git+https://host/x.git@v1#egg=x`` -> ``x @ git+https://host/x.git@v1``."""
    match = re.search(r"[#&]egg=([A-Za-z0-9_.-]+)", value)
    if not match:
        return value
    return f"{match[1]} @ {value.split('#', 1)[0]}"


def _include(
    project_dir: str,
    relative: str,
    number: int,
    target: str,
    into: Collected,
    *,
    constraint: bool,
    chain: tuple[str, ...],
) -> None:
    what = "constraints file" if constraint else "requirements file"
    if not target:
        into.problem(relative, number, f"names no {what}")
        return
    if target.startswith(("http://", "https://")):
        into.problem(
            relative,
            number,
            f"includes {target}: gpuenv installs files of the project "
            "only (download it into the project)",
        )
        return
    included = os.path.normpath((PurePosixPath(relative).parent / target).as_posix())
    if os.path.isabs(target) or not inside_project(project_dir, included):
        into.problem(
            relative,
            number,
            f"includes '{target}', which is outside the project folder "
            "(copy it into the project and include that copy)",
        )
        return
    if not os.path.isfile(os.path.join(project_dir, included)):
        into.problem(relative, number, f"includes '{target}', which does not exist")
        return
    if included in chain:
        return
    _read(project_dir, PurePosixPath(included).as_posix(), into, constraint=constraint, chain=chain)


def _credentials(url: str) -> bool:
    """Whether an index URL names a user or password (`https://user:token@host/...`).

    >>> _credentials("https://ann:s3cret@pypi.example/simple"), _credentials("https://pypi.org/simple")
    (True, False)
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return bool(parts.username or parts.password)


def _masked(url: str) -> str:
    """The URL with its user information hidden, for messages.

    >>> _masked("https://ann:s3cret@pypi.example/simple")
    'https://***@pypi.example/simple'
    """
    scheme, _, rest = url.partition("://")
    if "@" not in rest.split("/", 1)[0]:
        return url
    return f"{scheme}://***@{rest.split('@', 1)[1]}"
