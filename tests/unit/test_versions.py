from __future__ import annotations

import pytest

from gpuenv.common.versions import (
    ComputeCapability,
    DriverVersion,
    InvalidComputeCapability,
    InvalidConstraint,
    InvalidDriverVersion,
    matches,
    parse_constraint,
    release_of,
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
    assert DriverVersion.parse(low) < DriverVersion.parse(high)
    assert max(DriverVersion.parse(high), DriverVersion.parse(low)) == DriverVersion.parse(high)


@pytest.mark.parametrize(
    ("text", "branch", "shown"),
    [("535.104.05", 535, "535.104.05"), (" 545 ", 545, "545"), ("470.57.02", 470, "470.57.02")],
)
def test_a_driver_version_is_parsed_once_and_shown_as_written(
    text: str, branch: int, shown: str
) -> None:
    driver = DriverVersion.parse(text)
    assert (driver.branch, str(driver), f"{driver}") == (branch, shown, shown)
    assert driver == DriverVersion.parse(shown) and hash(driver) == hash(DriverVersion.parse(shown))
    assert driver != shown  # a value, not a string: compare values with values


def test_padded_versions_are_the_same_driver() -> None:
    assert DriverVersion.parse("545") == DriverVersion.parse("545.0.0")
    assert len({DriverVersion.parse("545"), DriverVersion.parse("545.0")}) == 1


@pytest.mark.parametrize("text", ["", "abc", "535.104.05.1.2", "-1", "535,104"])
def test_invalid_driver(text: str) -> None:
    with pytest.raises(InvalidDriverVersion):
        DriverVersion.parse(text)


@pytest.mark.parametrize(
    ("low", "high"), [("9.0", "12.0"), ("8.6", "8.9"), ("7.5", "8.0"), ("10.0", "10.3")]
)
def test_compute_capabilities_order_as_numbers(low: str, high: str) -> None:
    assert ComputeCapability.parse(low) < ComputeCapability.parse(high)
    assert sorted([ComputeCapability.parse(high), ComputeCapability.parse(low)])[0] == (
        ComputeCapability.parse(low)
    )


def test_compute_capability() -> None:
    cc = ComputeCapability.parse("8.6")
    assert (cc.major, cc.minor, cc.sm, str(cc)) == (8, 6, "sm_86", "8.6")
    assert ComputeCapability.parse("12.0") > ComputeCapability.parse("9.0")


@pytest.mark.parametrize("text", ["sm_86", "8", "8.10", "", "8.x"])
def test_invalid_compute_capability(text: str) -> None:
    with pytest.raises(InvalidComputeCapability):
        ComputeCapability.parse(text)


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
