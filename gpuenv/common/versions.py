"""Version rules: user constraints, NGC build versions, driver and compute-capability numbers.

NGC containers carry framework builds such as ``2.4.0a0+07cecf4168.nv24.05``: a
pre-release of 2.4.0 built from a commit. To a user that *is* PyTorch 2.4, so a
constraint is checked against the release a build precedes (its base version,
``2.4.0``). A constraint that itself names a pre-release or local version
(``==2.4.0a0+07cecf4168``) selects builds exactly. The lock keeps the full string.

>>> matches(parse_constraint("2.4"), "2.4.0a0+07cecf4168")
True
>>> matches(parse_constraint(">=2.4"), "2.4.0a0+07cecf4168")
True
>>> matches(parse_constraint("<2.4"), "2.4.0a0+07cecf4168")
False
>>> matches(parse_constraint("!=2.4.0"), "2.4.0a0+07cecf4168")
False
"""

from __future__ import annotations

import re
from functools import lru_cache

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

# packaging is imported where a constraint or a framework version is parsed: the driver
# and compute-capability rules below (every `gpuenv run` on a GPU) need none of it.


class InvalidConstraint(ValueError):
    """A version constraint gpuenv cannot read."""


class InvalidDriverVersion(ValueError):
    """A driver version that is not dotted numbers (``535.104.05``)."""


class InvalidComputeCapability(ValueError):
    """A compute capability that is not ``major.minor`` (``8.6``)."""


# Patterns as text: re compiles (and keeps) each on its first use, not at import.
_BARE_VERSION = r"^\d+(\.\d+)*(\.\*)?$"
_DRIVER = r"^\d+(\.\d+){0,3}$"
_COMPUTE_CAPABILITY = r"^(\d+)\.(\d)$"


@lru_cache(maxsize=1024)
def parse_constraint(text: str) -> SpecifierSet:
    """Read a user's version constraint; a bare version means "that series".

    ``"3.10"`` -> ``==3.10.*``; ``"2.4.*"`` -> ``==2.4.*``; ``">=2.1,<2.5"`` as written.

    >>> str(parse_constraint("3.10"))
    '==3.10.*'
    >>> str(parse_constraint(">=2.1, <2.5"))
    '<2.5,>=2.1'
    >>> parse_constraint("12.x")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    gpuenv.common.versions.InvalidConstraint: '12.x' is not a version or version specifier ...
    """
    stripped = text.strip()
    if re.match(_BARE_VERSION, stripped):
        series = stripped if stripped.endswith(".*") else f"{stripped}.*"
        return SpecifierSet(f"=={series}")
    if not stripped or "\n" in stripped:
        raise InvalidConstraint(_constraint_hint(text))
    try:
        spec = SpecifierSet(stripped)
    except InvalidSpecifier:
        raise InvalidConstraint(_constraint_hint(text)) from None
    if not list(spec):
        raise InvalidConstraint(_constraint_hint(text))
    return spec


def _constraint_hint(text: str) -> str:
    return f"'{text}' is not a version or version specifier (try '12.4', '>=12.1' or '>=2.1,<2.5')"


@lru_cache(maxsize=65536)
def parse_version(text: str) -> Version:
    """Parse a version from the matrix; cached, since the resolver asks for each row often."""
    return Version(text)


def is_version(text: str) -> bool:
    try:
        parse_version(text)
    except InvalidVersion:
        return False
    return True


@lru_cache(maxsize=1024)
def selects_builds(spec: SpecifierSet) -> bool:
    """Whether a constraint names a pre-release, dev or local version (a specific build)."""
    for specifier in spec:
        version = parse_version(specifier.version.removesuffix(".*"))
        if version.is_prerelease or version.is_devrelease or version.local is not None:
            return True
    return False


def matches(spec: SpecifierSet, text: str) -> bool:
    """Whether `text` (a version from the matrix) satisfies `spec`, with the NGC rule."""
    if selects_builds(spec):
        return spec.contains(parse_version(text), prereleases=True)
    return spec.contains(parse_version(release_of(text)), prereleases=True)


@lru_cache(maxsize=65536)
def release_of(text: str) -> str:
    """The release a build belongs to: ``2.4.0a0+07cecf4168`` -> ``2.4.0``."""
    return parse_version(text).base_version


def series(text: str, parts: int = 2) -> str:
    """``2.4.0a0+07cecf4168`` -> ``2.4``; used to suggest constraints a user can write."""
    return ".".join(str(n) for n in parse_version(text).release[:parts])


@lru_cache(maxsize=4096)
def driver_tuple(text: str) -> tuple[int, int, int, int]:
    """``535.104.05`` -> ``(535, 104, 5, 0)``; padded so ``545`` < ``545.23``.

    >>> driver_tuple("545") < driver_tuple("545.23.08")
    True
    """
    if not re.match(_DRIVER, text.strip()):
        raise InvalidDriverVersion(
            f"'{text}' is not a driver version (expected numbers like 535.104.05)"
        )
    numbers = [int(part) for part in text.strip().split(".")]
    padded = [*numbers, 0, 0, 0, 0][:4]
    return (padded[0], padded[1], padded[2], padded[3])


def driver_branch(text: str) -> int:
    """The driver branch (``R535``) a version belongs to."""
    return driver_tuple(text)[0]


@lru_cache(maxsize=256)
def compute_capability(text: str) -> tuple[int, int]:
    """``8.6`` -> ``(8, 6)``.

    >>> compute_capability("12.0") > compute_capability("9.0")
    True
    """
    match = re.match(_COMPUTE_CAPABILITY, text.strip())
    if not match:
        raise InvalidComputeCapability(
            f"'{text}' is not a compute capability (expected major.minor like 8.6)"
        )
    return int(match.group(1)), int(match.group(2))


def sm(text: str) -> str:
    """``8.6`` -> ``sm_86``, the name users see in "no kernel image" errors."""
    major, minor = compute_capability(text)
    return f"sm_{major}{minor}"
