"""The `gpuenv` process as a shell sees it: click is the one parser and the command
tree's error path the one way out, so the exit code and the output are click's and
gpuenv's, whatever happens to stdout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuenv.cli.context import Application
from gpuenv.cli.tree import main

from .fake_engine import FakeEngine

GPUENV = [sys.executable, "-m", "gpuenv.cli"]


def test_a_failure_in_a_process_is_one_message_and_its_code(tmp_path: Path) -> None:
    """No project in the folder: the message and exit code, through `python -m gpuenv.cli`."""
    ended = subprocess.run(
        [*GPUENV, "-C", str(tmp_path), "run", "--gpus", "1", "--", "true"],
        capture_output=True,
        text=True,
    )
    # `run` passes its command's exit code through: its own failures are 125 (issue 33),
    # the reason's code (3: the spec) said on stderr.
    assert ended.returncode == 125, ended.stderr
    assert "(reason 3: gpuenv.yaml" in ended.stderr
    assert ended.stderr.startswith("error: ") and "gpuenv.yaml" in ended.stderr
    assert "Traceback" not in ended.stderr and ended.stdout == ""
    checked = subprocess.run([*GPUENV, "-C", str(tmp_path), "check"], capture_output=True)
    assert checked.returncode == 3  # a command that runs nothing keeps the reason's own code


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["run", "--", "true"], 125),  # no gpuenv.yaml: gpuenv's own failure
        (["run", "--no-such-option"], 125),  # a usage error, as docker run's
        (["shell", "--no-such-option"], 125),
        (["wait", "no-such-run"], 125),  # no engine
        (["attach", "no-such-run"], 125),
        (["stop", "no-such-run"], 10),  # not a pass-through command: its own code
        (["lock", "--no-such-option"], 2),
    ],
)
def test_pass_through_commands_fail_with_125(tmp_path: Path, args: list[str], code: int) -> None:
    """CI cannot tell `pytest`'s 5 from gpuenv's 5: `run`, `shell`, `wait` and `attach`,
    which exit with their command's code, exit 125 when gpuenv itself fails (Docker's
    convention), other commands with the table's codes."""
    ended = subprocess.run(
        [*GPUENV, "-C", str(tmp_path), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "DOCKER_HOST": "unix:///nonexistent/gpuenv-test.sock"},
    )
    assert ended.returncode == code, ended.stderr
    assert "Traceback" not in ended.stderr


def test_usage_errors_and_the_version_exit_as_click_says(tmp_path: Path) -> None:
    wrong = subprocess.run(
        [*GPUENV, "resolve", "--no-such-option"], capture_output=True, text=True, cwd=tmp_path
    )
    assert wrong.returncode == 2 and "--no-such-option" in wrong.stderr
    version = subprocess.run([*GPUENV, "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith("gpuenv, version ")


def test_a_closed_pipe_exits_141() -> None:
    """`gpuenv --help | head -0`: the reader went away before the output was written."""
    child = subprocess.Popen([*GPUENV, "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout is not None and child.stderr is not None
    child.stdout.close()
    err = child.stderr.read()
    assert child.wait(timeout=60) == 141, err
    assert b"Traceback" not in err


def test_a_closed_stdout_is_no_failure() -> None:
    """`gpuenv --version >&-` (cron): no stdout at all is no failure."""
    ended = subprocess.run(
        ["sh", "-c", 'exec "$@" >&-', "sh", *GPUENV, "--version"], capture_output=True
    )
    assert (ended.returncode, ended.stderr) == (0, b"")


@pytest.mark.parametrize("argv", [["build"], ["build", "-q"], ["build", "--bake", "--quiet"]])
def test_the_no_op_build_prints_the_tag(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = FakeEngine(images_present={"gpuenv/demo:0123456789abcdef"})
    monkeypatch.setattr(
        "gpuenv.project.stamp.fresh_tag", lambda directory, bake: "gpuenv/demo:0123456789abcdef"
    )
    clicked = CliRunner().invoke(
        main,
        ["-C", str(tmp_path), *argv],
        catch_exceptions=False,
        obj=Application(connected=engine),
    )
    assert clicked.exit_code == 0
    assert clicked.stdout == "gpuenv/demo:0123456789abcdef\n"
    quiet = "-q" in argv or "--quiet" in argv
    assert clicked.stderr == ("" if quiet else "✓ up to date: nothing to build\n")


def test_a_quiet_view_loads_no_rich() -> None:
    """`gpuenv build -q` (or a run that builds, quietly) shows nothing: rich stays out."""
    code = (
        "import sys\nfrom gpuenv.cli.base import view_factory\n"
        "view = view_factory(True)()\nview.build_started('x')\n"
        "print(type(view).__name__, 'rich' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.split() == ["QuietView", "False"], out.stderr
