"""Scriptable output (issue 12, item 6): every --json output, on success and on failure,
is one JSON object (or the command's documented list) on stdout that validates against
the schema gpuenv ships for the command; a failure carries the exit code, the message,
the hint and, for resolution, the rejected candidates with their reasons."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner, Result

from gpuenv.cli.tree import COMMANDS, main
from gpuenv.errors import EXIT_CODES
from tests.unit.fake_engine import lock_packages

from ..conftest import reseal
from ..jsonschemas import names, schema, validate, validate_output

RTX4090 = ["--driver", "550.54.15", "--gpu", "RTX 4090"]
NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/gpuenv-test.sock"}


def run(project: Path, *args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, ["-C", str(project), *args], env=env, catch_exceptions=False)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "requirements.txt").write_text("torch==2.4.0\n")
    return tmp_path


@pytest.fixture
def locked(project: Path) -> Path:
    assert run(project, "init", *RTX4090).exit_code == 0
    lock_packages(str(project))
    return project


@pytest.mark.parametrize("name", names())
def test_every_shipped_schema_is_a_valid_schema(name: str) -> None:
    jsonschema.Draft202012Validator.check_schema(schema(name))
    assert schema(name)["$id"] == f"urn:gpuenv:schema:{name}"


def test_every_command_with_json_has_a_schema() -> None:
    """A command that grows --json (another helper's logs, wait, usage…) needs its schema,
    and every schema but error.json and the dashboard's belongs to a command with --json."""
    import click

    from gpuenv.cli.context import json_requested

    context = click.Context(main)
    commands = [([name], name) for name in COMMANDS] + [(["matrix", "sync"], "matrix-sync")]
    with_json = {
        schema_name
        for words, schema_name in commands
        if json_requested(main, context, [*words, "--json"])
    }
    # dashboard-*: the JSON endpoints behind `gpuenv dashboard`'s page, not a command's
    api = {name for name in names() if name.startswith("dashboard-")}
    assert api and with_json == set(names()) - {"error"} - api


def edit_lock(project: Path, old: str, new: str) -> None:
    path = project / "gpuenv.lock"
    path.write_text(path.read_text().replace(old, new))
    reseal(path)


# (name, args, expected exit code, setup): each a --json run whose stdout must validate.
CASES = [
    ("resolve", ["resolve", *RTX4090], 0, None),
    ("resolve", ["resolve", "--framework", "pytorch", "--version", "1.0", *RTX4090], 4, None),
    ("resolve", ["resolve", "--framework", "pytorch", "--driver", "abc"], 2, None),
    ("resolve", ["resolve", "--framework", "pytorch", "--gpu", "A100"], 2, None),
    ("resolve", ["resolve", "--framework", "pytorhc"], 2, None),
    ("lock", ["lock"], 0, None),
    ("lock", ["lock", "--upgrade", *RTX4090], 0, None),
    ("lock", ["lock", "--check"], 0, None),
    ("lock", ["lock", "--check", "--upgrade"], 2, None),
    ("lock", ["lock", "--check"], 5, "spec-changed"),
    ("lock", ["lock", "--check"], 5, "impossible-image"),
    ("init", ["init", "--force", *RTX4090], 0, None),
    ("init", ["init"], 2, None),
    ("init", ["init", "--force", "--framework", "pytorch", "--version", "1.0", *RTX4090], 4, None),
    ("check", ["check"], 0, None),
    ("check", ["check"], 3, "bad-spec"),
    ("check", ["check"], 5, "impossible-image"),
    ("check", ["check"], 5, "no-lock"),
    ("matrix", ["matrix"], 0, None),
    ("matrix", ["matrix", "pytorch"], 0, None),
    ("matrix", ["matrix", "gpus"], 0, None),
    ("matrix", ["matrix", "cuda"], 0, None),
    ("doctor", ["doctor"], 15, "no-engine"),
    ("ps", ["ps"], 10, "no-engine"),
    ("images", ["images"], 10, "no-engine"),
    ("top", ["top"], 0, "no-gpus"),
    ("jobs", ["jobs"], 2, "no-squeue"),
]


@pytest.mark.parametrize(("name", "args", "code", "setup"), CASES)
def test_json_output_validates(
    locked: Path,
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    args: list[str],
    code: int,
    setup: str | None,
) -> None:
    env: dict[str, str] = {}
    if setup == "spec-changed":
        (locked / "requirements.txt").write_text("torch==2.4.0\nnumpy\n")
    elif setup == "impossible-image":
        edit_lock(locked, "pytorch:24.06-py3", "pytorch:24.10-py3")
    elif setup == "bad-spec":
        (locked / "gpuenv.yaml").write_text("framework: pytorch\ncuda: 12.x\n")
    elif setup == "no-lock":
        (locked / "gpuenv.lock").unlink()
    elif setup in ("no-engine", "no-gpus", "no-squeue"):
        host = tmp_path_factory.mktemp("host") / "host.json"
        host.write_text('{"driver": null, "gpus": []}')
        env = {**NO_ENGINE, "GPUENV_HOST_FILE": str(host), "PATH": "/nonexistent"}
    result = run(locked, *args, "--json", env=env)
    assert result.exit_code == code, result.output
    value = validate_output(name, result.stdout)
    if code and isinstance(value, dict):
        assert value["exit_code"] == code and value["ok"] is False
        assert value["error"]["message"] in result.stderr  # the same words as for people


def test_a_failed_resolution_lists_the_rejected_candidates(project: Path) -> None:
    """Issue 12: nothing on stdout when `resolve --json` failed."""
    result = run(
        project, "resolve", "--framework", "pytorch", "--version", "1.0", *RTX4090, "--json"
    )
    assert result.exit_code == 4
    failure = json.loads(result.stdout)
    error = failure["error"]
    assert error["type"] == "ResolutionError" and error["hint"]
    assert error["candidates"] and not any(c["fits"] for c in error["candidates"])
    checks = {r["check"] for c in error["candidates"] for r in c["rejections"]}
    assert "version" in checks
    assert all(r["reason"] for c in error["candidates"] for r in c["rejections"])


def test_a_located_spec_error_carries_its_problems(project: Path) -> None:
    (project / "gpuenv.yaml").write_text("framework: pytorch\ncuda: 12.x\n")
    result = run(project, "resolve", "--json")
    assert result.exit_code == 3
    (problem,) = json.loads(result.stdout)["error"]["problems"]
    assert problem["line"] == 2 and problem["field"] == "cuda"


def test_check_json_names_every_item(locked: Path) -> None:
    edit_lock(locked, "pytorch:24.06-py3", "pytorch:24.10-py3")
    result = run(locked, "check", "--json")
    report = validate_output("check", result.stdout)
    subjects = [item["subject"] for item in report["items"]]
    assert subjects == ["matrix", "gpuenv.yaml", "gpuenv.lock", "dependencies"]
    assert [item["ok"] for item in report["items"]] == [True, True, False, True]
    assert report["error"]["type"] == "LockError" and "--upgrade" in report["error"]["hint"]


def test_the_json_of_a_command_gpuenv_runs_is_not_gpuenv_s(locked: Path) -> None:
    """`gpuenv run train.py --json`: --json is the script's, so a failure stays text."""
    result = run(locked, "run", "train.py", "--json", env=NO_ENGINE)
    assert result.exit_code == 125 and "(reason 10:" in result.stderr
    assert result.stdout == ""


def test_every_exit_code_of_an_error_is_in_the_error_schema() -> None:
    """error.json's exit_code is any documented failure code."""
    for entry in EXIT_CODES:
        if entry.code:
            validate(
                "error",
                {
                    "ok": False,
                    "exit_code": entry.code,
                    "error": {"type": "X", "message": "m", "hint": None},
                },
            )


def test_ctrl_c_with_json_is_a_json_failure_too(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gpuenv.cli.project as policy  # where the command calls it

    def interrupted(*args: object, **kwargs: object) -> object:
        raise KeyboardInterrupt

    monkeypatch.setattr(policy, "check_project", interrupted)
    result = run(project, "check", "--json")
    assert result.exit_code == 130
    assert validate_output("check", result.stdout)["error"]["type"] == "Interrupted"


def test_a_pass_through_failure_keeps_its_reason_in_the_json() -> None:
    """run, shell, wait, attach exit 125 for gpuenv's own failures; the table's code of
    the reason stays in `reason_code` (issue 33, item 4)."""
    from gpuenv.cli.failure import error_data
    from gpuenv.errors import GpusBusy

    data = error_data(GpusBusy("no free GPU"), 125)
    validate("error", data)
    assert (data["exit_code"], data["reason_code"]) == (125, 16)
    assert "reason_code" not in error_data(GpusBusy("no free GPU"))
