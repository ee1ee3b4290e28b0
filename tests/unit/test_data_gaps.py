"""Every NGC row complete, or its gap said (issue 31, item 1): a framework version the
matrix lacks is recorded as not found, with where it was looked for, and every message
about it says "not recorded" and how to record it; never shown as NVIDIA's fact."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuenv.cli.tree import main
from gpuenv.matrix.load import load_matrix


def test_every_shipped_row_has_a_framework_version_or_says_why_not() -> None:
    matrix = load_matrix()
    missing = [
        f"{row.image} ({row.source})"
        for row in matrix.images
        if row.framework != "none" and not row.framework_version
        if "searched" not in row.framework_version_unknown
    ]
    assert not missing, "rows without a framework version nor a recorded search: " + ", ".join(
        missing
    )
    recorded = [r for r in matrix.images if r.framework_version and r.framework_version_unknown]
    assert not recorded  # a reason for a gap only where there is a gap


@pytest.mark.parametrize(
    ("framework", "how"),
    [
        ("jax", "`gpuenv matrix sync jax` cannot (NGC jax images state no version variable)"),
        ("tensorflow", "`gpuenv matrix sync tensorflow` reads it from the images' own environment"),
    ],
)
def test_the_matrix_table_says_what_its_question_marks_mean(framework: str, how: str) -> None:
    result = CliRunner().invoke(main, ["matrix", framework])
    assert result.exit_code == 0, result.output
    said = " ".join(result.stderr.split())
    assert "? = not recorded:" in said and how in said


def test_a_version_no_recorded_image_has_is_not_shown_as_nvidias_fact(tmp_path: Path) -> None:
    """`jax>=0.11` was told "no JAX image has JAX >=0.11; the nearest NVIDIA shipped":
    with most JAX versions unrecorded, that is a gap in gpuenv's data, and said so."""
    result = CliRunner().invoke(
        main,
        [
            *("-C", str(tmp_path), "resolve", "--framework", "jax", "--version", ">=0.11"),
            *("--driver", "580.95.05", "--gpu", "H100"),
        ],
    )
    assert result.exit_code == 4, result.output
    said = " ".join(result.stderr.split())
    assert "no JAX image whose version the matrix records has JAX >=0.11" in said
    assert "nearest NVIDIA shipped" not in said
    assert "images is not recorded: 26.07-py3" in said and "gpuenv matrix sync jax" in said


def test_jax_versions_found_since_the_audit() -> None:
    """Each from the public report named in the row's note ([S]); 25.01's is unverified."""
    rows = {row.tag: row for row in load_matrix().images_for("jax")}
    assert rows["25.10-py3"].framework_version == "0.7.2"
    assert rows["26.04-py3"].framework_version == "0.9.2"
    assert rows["26.05-py3"].framework_version == "0.10.0.dev20260415+c98e1bb97"
    assert rows["25.01-py3"].framework_version == "0.4.34"
    assert "framework_version" in rows["25.01-py3"].unverified
