from __future__ import annotations

import pytest

from gpuenv.common.versions import (
    InvalidComputeCapability,
    InvalidConstraint,
    InvalidDriverVersion,
    compute_capability,
    driver_tuple,
    matches,
    parse_constraint,
    release_of,
    sm,
)


@pytest.mark.parametrize(
    ("constraint", "version", "expected"),
    [
        # The NGC rule: a pre-release build counts as the release it precedes.
        ("2.4", "2.4.0a0+07cecf4168", True),
        ("2.4", "2.4.0a0+07cecf4168.nv24.05", True),
        (">=2.4", "2.4.0a0+07cecf4168", True),
        ("==2.4.*", "2.4.0a0+07cecf4168", True),
        ("<2.4", "2.4.0a0+07cecf4168", False),
        ("<2.5", "2.4.0a0+07cecf4168", True),
        ("2.3", "2.4.0a0+07cecf4168", False),
        (">=2.1,<2.4", "2.3.0a0+40ec155e58", True),
        ("~=2.3", "2.3.0a0+40ec155e58", True),
        ("==2.4.0a0+07cecf4168", "2.4.0a0+07cecf4168", True),
        ("2", "2.0.0", True),
        ("2.0.0", "2.0.0", True),
        # Python and CUDA series.
        ("3.10", "3.10", True),
        ("3.10", "3.10.12", True),
        ("3.1", "3.10", False),
        ("3.12", "3.12.3", True),
        ("12.4", "12.4.1", True),
        (">=12.4", "12.3.2", False),
        (">=12.4", "13.0.0", True),
        ("12", "12.9.1", True),
        ("!=12.4.*", "12.4.1", False),
    ],
)
def test_matches(constraint: str, version: str, expected: bool) -> None:
    assert matches(parse_constraint(constraint), version) is expected


@pytest.mark.parametrize(
    "text", ["12.x", "", "  ", ">=", "latest", "2.4;rm -rf /", "1.0\n2.0", "=>2.4"]
)
def test_invalid_constraints(text: str) -> None:
    with pytest.raises(InvalidConstraint, match="not a version or version specifier"):
        parse_constraint(text)


def test_bare_versions_mean_series() -> None:
    assert str(parse_constraint("3.10")) == "==3.10.*"
    assert str(parse_constraint("2.4.*")) == "==2.4.*"


def test_release_of_keeps_full_string_elsewhere() -> None:
    assert release_of("2.4.0a0+07cecf4168") == "2.4.0"


@pytest.mark.parametrize(
    ("low", "high"),
    [("545", "545.23.08"), ("535.104.05", "545"), ("470.57", "470.82.01"), ("9.0", "10.0")],
)
def test_driver_order(low: str, high: str) -> None:
    assert driver_tuple(low) < driver_tuple(high)


@pytest.mark.parametrize("text", ["", "abc", "535.104.05.1.2", "-1", "535,104"])
def test_invalid_driver(text: str) -> None:
    with pytest.raises(InvalidDriverVersion):
        driver_tuple(text)


def test_compute_capability() -> None:
    assert compute_capability("12.0") > compute_capability("9.0")
    assert sm("8.6") == "sm_86"
    with pytest.raises(InvalidComputeCapability):
        compute_capability("sm_86")


@pytest.mark.parametrize(
    ("constraint", "version", "expected"),
    [
        # A build *is* its release: excluding the release excludes its builds.
        ("!=2.4.0", "2.4.0a0+07cecf4168", False),
        ("!=2.4", "2.4.0a0+07cecf4168", False),
        (">2.3", "2.4.0a0+07cecf4168", True),
        ("<=2.4", "2.4.0a0+07cecf4168", True),
        # Naming a build selects builds exactly.
        ("==2.4.0a0+07cecf4168", "2.4.0a0+f70bd71a48", False),
        ("<2.4.0a1", "2.4.0a0+07cecf4168", True),
    ],
)
def test_builds_count_as_their_release(constraint: str, version: str, expected: bool) -> None:
    assert matches(parse_constraint(constraint), version) is expected
