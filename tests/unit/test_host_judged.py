"""The host is judged wherever a host is known (issue 22, item 8): `check` fails a lock
the known host cannot run (a host file here; NVML's host the same way), and `resolve`
says when its answer is not the lock's image."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from gpuenv.cli.tree import main

LOCKED_FOR = ["--driver", "550.54.15", "--gpu", "H100"]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "requirements.txt").write_text("torch==2.3.1\n")
    made = CliRunner().invoke(main, ["-C", str(tmp_path), "init", *LOCKED_FOR])
    assert made.exit_code == 0, made.output
    return tmp_path


def check(project: Path, host: dict[str, object] | None) -> Result:
    env = {}
    if host is not None:
        path = project / "host.json"
        path.write_text(json.dumps(host))
        env["GPUENV_HOST_FILE"] = str(path)
    return CliRunner().invoke(main, ["-C", str(project), "check"], env=env)


@pytest.mark.parametrize(
    ("host", "said"),
    [
        # below the locked image's minimum driver (matrices/ngc-pytorch.yaml 24.04: 545),
        # on a consumer GPU (no forward compatibility: CUDA Compatibility guide)
        ({"driver": "535.104.05", "gpus": ["RTX 4090"]}, "545"),
        # a branch past the last one for Volta (matrices/cuda.yaml: R580)
        (
            {"driver": "595.45.04", "gpus": ["Tesla V100-SXM2-32GB"]},
            "R580 is the last branch that drives it",
        ),
    ],
)
def test_check_fails_a_lock_the_known_host_cannot_run(
    project: Path, host: dict[str, object], said: str
) -> None:
    result = check(project, host)
    assert result.exit_code == 4, result.output
    output = " ".join(result.output.split())
    assert "this host cannot run the locked image nvcr.io/nvidia/pytorch:24.04-py3" in output
    assert said in output
    assert "re-resolve for this host with `gpuenv lock --upgrade`" in output


def test_check_says_the_lock_runs_on_a_host_that_fits(project: Path) -> None:
    result = check(project, {"driver": "550.54.15", "gpus": ["H100"]})
    assert result.exit_code == 0, result.output
    assert (
        "✓ host: nvcr.io/nvidia/pytorch:24.04-py3 runs on driver 550.54.15, H100" in result.output
    )


def test_check_never_marks_an_unjudged_host_as_fine(project: Path) -> None:
    result = check(project, {"note": "a host without a driver"})
    assert result.exit_code == 0, result.output
    assert "✓ host" not in result.output
    assert "the lock was not checked against a host" in " ".join(result.output.split())


def test_resolve_says_when_its_answer_is_not_the_locks_image(project: Path) -> None:
    # --version 2.4 against the project's torch==2.3.1 contradicts (issue 31: resolve
    # reads the project's pins as lock does): the pin goes, the spec's version moves.
    (project / "requirements.txt").write_text("numpy\n")
    newer = CliRunner().invoke(
        main, ["-C", str(project), "resolve", "--version", "2.4", *LOCKED_FOR]
    )
    assert newer.exit_code == 0, newer.output
    assert "this answer differs from gpuenv.lock, which pins nvcr.io/nvidia/pytorch:24.04-py3" in (
        " ".join(newer.stderr.split())
    )
    same = CliRunner().invoke(main, ["-C", str(project), "resolve", *LOCKED_FOR])
    assert same.exit_code == 0, same.output
    assert "differs from gpuenv.lock" not in same.output
