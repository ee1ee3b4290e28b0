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
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TypeVar

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


@dataclass(frozen=True, order=True, repr=False)
class DriverVersion:
    """An NVIDIA driver version, parsed once where it comes in (the host, the matrix, a
    host file, --driver): ordered by its numbers, padded so ``545`` < ``545.23.08``,
    shown as written.

    >>> DriverVersion.parse("545") < DriverVersion.parse("545.23.08")
    True
    >>> driver = DriverVersion.parse("535.104.05")
    >>> driver.branch, str(driver), driver
    (535, '535.104.05', DriverVersion('535.104.05'))
    """

    numbers: tuple[int, int, int, int]
    text: str = field(compare=False)

    @classmethod
    def parse(cls, text: str) -> DriverVersion:
        """Read ``535.104.05`` (one to four dotted numbers); InvalidDriverVersion else."""
        return _driver(text)

    @property
    def branch(self) -> int:
        """The driver branch (``R535``) it belongs to."""
        return self.numbers[0]

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"DriverVersion({self.text!r})"


@lru_cache(maxsize=4096)
def _driver(text: str) -> DriverVersion:
    if not re.match(_DRIVER, text.strip()):
        raise InvalidDriverVersion(
            f"'{text}' is not a driver version (expected numbers like 535.104.05)"
        )
    numbers = [int(part) for part in text.strip().split(".")]
    padded = [*numbers, 0, 0, 0, 0][:4]
    return DriverVersion((padded[0], padded[1], padded[2], padded[3]), text.strip())


@dataclass(frozen=True, order=True, repr=False)
class ComputeCapability:
    """A GPU's compute capability (``8.6``), parsed once where it comes in: ordered as
    numbers, so 12.0 is above 9.0; `sm` is the name "no kernel image" errors use.

    >>> ComputeCapability.parse("12.0") > ComputeCapability.parse("9.0")
    True
    >>> cc = ComputeCapability.parse("8.6")
    >>> str(cc), cc.sm, cc
    ('8.6', 'sm_86', ComputeCapability('8.6'))
    """

    major: int
    minor: int
    text: str = field(default="", compare=False)  # as written, where it was read

    @classmethod
    def parse(cls, text: str) -> ComputeCapability:
        """Read ``major.minor`` (``8.6``); InvalidComputeCapability else."""
        return _compute_capability(text)

    @property
    def sm(self) -> str:
        return f"sm_{self.major}{self.minor}"

    def __str__(self) -> str:
        return self.text or f"{self.major}.{self.minor}"

    def __repr__(self) -> str:
        return f"ComputeCapability('{self}')"


@lru_cache(maxsize=256)
def _compute_capability(text: str) -> ComputeCapability:
    match = re.match(_COMPUTE_CAPABILITY, text.strip())
    if not match:
        raise InvalidComputeCapability(
            f"'{text}' is not a compute capability (expected major.minor like 8.6)"
        )
    return ComputeCapability(int(match.group(1)), int(match.group(2)), text.strip())


def as_written(value: DriverVersion | ComputeCapability | None) -> str | None:
    """A driver version or compute capability as it was written, for data (JSON, a lock,
    the overlay); None stays None."""
    return None if value is None else str(value)


def recorded_driver(value: object) -> DriverVersion | None:
    """A driver version a record kept as text (a lock, a stamp); None where it kept none,
    or something that is not one (a file edited by hand).

    >>> recorded_driver("550.54.15"), recorded_driver(None), recorded_driver("R550")
    (DriverVersion('550.54.15'), None, None)
    """
    return _recorded(DriverVersion.parse, value)


def recorded_capability(value: object) -> ComputeCapability | None:
    """A compute capability a record kept as text; None where it kept none or another
    thing."""
    return _recorded(ComputeCapability.parse, value)


_Value = TypeVar("_Value", DriverVersion, ComputeCapability)


def _recorded(parse: Callable[[str], _Value], value: object) -> _Value | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return parse(value)
    except ValueError:  # InvalidDriverVersion, InvalidComputeCapability
        return None
