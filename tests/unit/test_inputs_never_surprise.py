"""Inputs that never surprise (issue 31, item 4): each odd file a user can have ends in
that file's own exit code and a message that names it, never in exit 1 or a lock on
something else. Table-driven: each case names the file kind and the exit code."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from gpuenv.cli.tree import main
from gpuenv.reservations.claims import CLAIM_PREFIX, ClaimStore
from gpuenv.reservations.statedir import SHARED_STATE_DIR

A100 = ["--driver", "550.54.15", "--gpu", "A100"]
SPEC = "name: p\nframework: pytorch\nversion: '2.3'\n"
DEEP = 5000  # past Python's recursion limit in every parser


def invoke(project: Path, *args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, ["-C", str(project), *args], env=env)


def said(result: Result) -> str:
    return " ".join(result.stderr.split())


def deep_json() -> str:
    return '{"driver": "550.54.15", "gpus": ' + "[" * DEEP + "]" * DEEP + "}"


def deep_toml() -> str:
    return "[project]\nname = 'p'\ndependencies = " + "[" * DEEP + "]" * DEEP + "\n"


def deep_yaml(key: str) -> str:
    return f"{key}: " + "[" * 900 + "]" * 900 + "\n"


def locked(project: Path) -> None:
    """A valid spec and lock in `project`, as `gpuenv lock` writes them."""
    (project / "gpuenv.yaml").write_text(SPEC)
    result = invoke(project, "lock", *A100)
    assert result.exit_code == 0, result.output


# (file kind, file name, its text, command, exit code, what the message says)
NESTED = [
    ("spec", "gpuenv.yaml", SPEC + deep_yaml("env"), ("check",), 3, "nested more than 64"),
    ("pyproject", "pyproject.toml", deep_toml(), ("init", *A100), 3, "pyproject.toml"),
    ("conda", "environment.yml", deep_yaml("dependencies"), ("init", *A100), 3, "environment.yml"),
    ("lock", "gpuenv.lock", None, ("check",), 5, "gpuenv.lock is damaged"),
    (
        "uv lock",
        "uv.lock",
        "version = 1\npackage = " + "[" * DEEP + "]" * DEEP,
        ("init", *A100),
        3,
        "uv.lock",
    ),
]


@pytest.mark.parametrize(
    ("kind", "name", "text", "command", "code", "message"),
    NESTED,
    ids=[case[0] for case in NESTED],
)
def test_a_file_nested_too_deeply_is_that_files_error(
    tmp_path: Path,
    kind: str,
    name: str,
    text: str | None,
    command: tuple[str, ...],
    code: int,
    message: str,
) -> None:
    if kind == "lock":
        locked(tmp_path)
        text = (tmp_path / name).read_text() + deep_yaml("extra")
    if kind == "uv lock":
        (tmp_path / "pyproject.toml").write_text(
            "[project]\nname = 'p'\nversion = '1'\ndependencies = ['torch==2.3.1']\n"
        )
    assert text is not None
    (tmp_path / name).write_text(text)
    result = invoke(tmp_path, *command)
    assert result.exit_code == code, result.output
    assert message in said(result)
    assert "RecursionError" not in result.output and "internal error" not in result.output


def test_a_host_file_nested_too_deeply_is_exit_7(tmp_path: Path) -> None:
    host = tmp_path / "host.json"
    host.write_text(deep_json())
    result = invoke(
        tmp_path, "resolve", "--framework", "pytorch", env={"GPUENV_HOST_FILE": str(host)}
    )
    assert result.exit_code == 7, result.output
    assert "invalid JSON: nested more than 64 levels deep" in said(result)


def test_a_claim_nested_too_deeply_is_one_bad_file_not_everyones_crash(tmp_path: Path) -> None:
    """Anyone may write a file into the shared state folder: every reader of the claims
    (`ps`, `top`, a run choosing GPUs) names it and goes on."""
    store = ClaimStore(str(tmp_path / "state"))
    bad = f"{CLAIM_PREFIX}deep.json"
    with open(os.path.join(store.directory, bad), "w") as handle:
        handle.write(deep_json())
    assert store.claims() == []
    assert any(bad in problem and "is not valid JSON" in problem for problem in store.problems)


def fifo(path: Path) -> None:
    os.mkfifo(path)


def folder(path: Path) -> None:
    path.mkdir()


def device(path: Path) -> None:
    path.symlink_to("/dev/zero")


def dangling(path: Path) -> None:
    path.symlink_to(path.parent / "nowhere")


UNREADABLE = [
    ("named pipe", fifo, "is a named pipe, not a file"),
    ("folder", folder, "is a folder, not a file"),
    ("link to a device", device, "is a link to /dev/zero, outside the project folder"),
    ("dangling link", dangling, "requirements.txt: "),
]


@pytest.mark.parametrize("name", ["requirements.txt", "pyproject.toml", "environment.yml"])
@pytest.mark.parametrize(
    ("kind", "make", "message"), UNREADABLE, ids=[case[0] for case in UNREADABLE]
)
def test_a_default_dependency_file_that_cannot_be_read_is_exit_3(
    tmp_path: Path, name: str, kind: str, make: Callable[[Path], None], message: str
) -> None:
    """As a file named in `requirements:` is: never skipped as if it were not there."""
    make(tmp_path / name)
    result = invoke(tmp_path, "init", *A100)
    assert result.exit_code == 3, result.output
    assert message.replace("requirements.txt", name) in said(result) or kind == "dangling link"
    assert f"{name}: " in said(result)
    assert not (tmp_path / "gpuenv.yaml").exists() and not (tmp_path / "gpuenv.lock").exists()


@pytest.mark.parametrize("command", ["check", "resolve", "lock"])
@pytest.mark.parametrize(
    ("kind", "make", "message"), UNREADABLE[:2], ids=[case[0] for case in UNREADABLE[:2]]
)
def test_a_named_requirements_file_that_is_no_file_is_said_so(
    tmp_path: Path, command: str, kind: str, make: Callable[[Path], None], message: str
) -> None:
    """`requirements: req.txt` naming a FIFO or a folder: exit 3 saying what it is (not
    that it does not exist), in every command that reads the spec."""
    make(tmp_path / "req.txt")
    (tmp_path / "gpuenv.yaml").write_text("framework: pytorch\nrequirements: req.txt\n")
    result = invoke(tmp_path, command, *([] if command == "check" else A100))
    assert result.exit_code == 3, result.output
    assert f"'req.txt' {message}" in said(result), (kind, said(result))


def test_every_json_output_is_strict_json(tmp_path: Path) -> None:
    locked(tmp_path)
    for command in (("check", "--json"), ("resolve", "--json", *A100)):
        result = invoke(tmp_path, *command)
        json.loads(result.stdout, parse_constant=_refuse)


def _refuse(name: str) -> None:
    raise AssertionError(f"{name} is not JSON")


# (a GPU's field in a host file, its value as JSON text, what is said of it)
IMPOSSIBLE = [
    ("temperature_c", "NaN", "expected a finite number, got NaN"),
    ("power_w", "Infinity", "expected a finite number, got Infinity"),
    ("power_limit_w", "-Infinity", "expected a finite number, got -Infinity"),
    ("utilization", "250", "expected a number from 0 to 100 (%), got 250"),
    ("temperature_c", "-300", "expected a number from -40 to 150 °C, got -300"),
    ("memory_used_mib", "99999", "99999 MiB used is more than the GPU's memory_total_mib (81920)"),
    ("index", "99999999999999999999", "expected a whole number from 0 to 4095"),
    ("memory_total_mib", "1e30", "expected a whole number from 0 to 16777216"),
    ("xids", "[-1]", "expected a list of XID numbers (0 to 65535)"),
    ("processes", '[{"pid": 0}]', "expected a process id from 1 to 4194304"),
]


@pytest.mark.parametrize(("field", "value", "message"), IMPOSSIBLE)
def test_a_host_file_value_no_gpu_can_report_is_refused_with_its_field(
    tmp_path: Path, field: str, value: str, message: str
) -> None:
    gpu: dict[str, object] = {"name": "A100", "memory_total_mib": 81920}
    gpu.pop(field, None)
    text = json.dumps({"driver": "550.54.15", "gpus": [gpu]})
    text = text.replace('"A100"', f'"A100", "{field}": {value}', 1)
    host = tmp_path / "host.json"
    host.write_text(text)
    result = invoke(
        tmp_path, "resolve", "--framework", "pytorch", env={"GPUENV_HOST_FILE": str(host)}
    )
    assert result.exit_code == 7, result.output
    assert f"field 'gpus[0].{field}" in result.stderr
    assert message in said(result)


# (a value in gpuenv.yaml's env:, what `check` says of it; None: valid)
ENV_VALUES = [
    ("/opt/tools/bin:$PATH", None),
    ("${CUDA_HOME}/lib64", None),
    ("${LD_LIBRARY_PATH:-/usr/lib}", None),
    ("${DEBUG:+--verbose}", None),
    ("costs \\\\$5", None),
    ("${PATH", "'${' is not closed: write ${NAME}, or \\$ for a literal $"),
    ("${PATH:?unset}", "'${PATH:?unset}' is not a reference gpuenv expands"),
    ("pa$$word", "'$$' is not a literal $ here: write \\$"),
    ("price: $5", "a '$' that names no variable at '$5': write \\$ for a literal $"),
]


@pytest.mark.parametrize(("value", "message"), ENV_VALUES)
def test_env_references_are_expanded_or_refused_with_the_fix(
    tmp_path: Path, value: str, message: str | None
) -> None:
    """Never passed literally: `check` and `lock` take what a run expands and refuse the
    rest (exit 3, the field and its line), with the fix."""
    (tmp_path / "gpuenv.yaml").write_text(f'{SPEC}env:\n  X: "{value}"\n')
    for command in (("check",), ("lock", *A100)):
        result = invoke(tmp_path, *command)
        if message is None:
            assert "field 'env.X'" not in result.output
            continue
        assert result.exit_code == 3, result.output
        assert "gpuenv.yaml:5" in result.stderr and "field 'env.X'" in result.stderr
        assert message in said(result)


def test_a_byte_order_mark_is_read_past_as_pip_does(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_bytes(b"\xef\xbb\xbftorch==2.3.1\n")
    result = invoke(tmp_path, "init", *A100)
    assert result.exit_code == 0, result.output
    assert "requirements.txt:1: torch==2.3.1" in said(result)


@pytest.mark.parametrize(
    ("line", "rewrite"),
    [
        (
            "git+https://github.com/org/repo.git#egg=mypkg",
            "mypkg @ git+https://github.com/org/repo.git",
        ),
        (
            "git+https://github.com/org/repo.git@v1.2#subdirectory=py&egg=my_pkg",
            "my_pkg @ git+https://github.com/org/repo.git@v1.2",
        ),
        ("https://example.org/pkg-1.0.tar.gz#egg=pkg", "pkg @ https://example.org/pkg-1.0.tar.gz"),
    ],
)
def test_a_url_named_by_egg_is_answered_with_its_pep_508_rewrite(
    tmp_path: Path, line: str, rewrite: str
) -> None:
    (tmp_path / "requirements.txt").write_text(f"torch==2.3.1\n{line}\n")
    result = invoke(tmp_path, "init", *A100)
    assert result.exit_code == 3, result.output
    assert (
        f"requirements.txt:2: '{line}' is not a valid requirement: it names its package the legacy way (#egg=)"
        in said(result)
    )
    assert f"write it as PEP 508 has it, '{rewrite}'" in said(result)


# (a conda package line in environment.yml, the pip specifier it means)
CONDA_PINS = [
    ("jax=0.4.26", "jax==0.4.26.*"),
    ("jax==0.4.26", "jax==0.4.26"),
    ("jax 0.4.26", "jax==0.4.26"),
    ("conda-forge::jax=0.4.26=py310_0", "jax==0.4.26.*"),
    ("jax>=0.4.26,<0.4.27", "jax<0.4.27,>=0.4.26"),
]


@pytest.mark.parametrize(("line", "pin"), CONDA_PINS)
def test_a_conda_framework_pin_steers_as_the_same_pip_pin_does(
    tmp_path: Path, line: str, pin: str
) -> None:
    """`jax=0.4.26` in environment.yml locked JAX 0.4.33; in requirements.txt, 0.4.26."""
    (tmp_path / "environment.yml").write_text(f"dependencies:\n  - python=3.10\n  - {line}\n")
    result = invoke(tmp_path, "init", *A100)
    assert result.exit_code == 0, result.output
    assert f"environment.yml:3: {pin}" in said(result)
    assert "reference: nvcr.io/nvidia/jax:24.04-py3" in (tmp_path / "gpuenv.lock").read_text()


@pytest.mark.parametrize(
    ("line", "said_of_it"),
    [
        ("numpy>=1.20", "its pip equivalent is 'numpy>=1.20'"),
        ("scipy 1.11.*", "its pip equivalent is 'scipy==1.11.*'"),
        ("numpy=1.2|1.3", "alternatives (|) and [key=value] specs are not read"),
    ],
)
def test_conda_specs_with_operators_are_mapped_to_pip(
    tmp_path: Path, line: str, said_of_it: str
) -> None:
    (tmp_path / "environment.yml").write_text(f"dependencies:\n  - jax==0.4.26\n  - {line}\n")
    result = invoke(tmp_path, "init", *A100)
    assert said_of_it in said(result), result.output


def test_check_never_ticks_a_file_it_then_reports_a_problem_in(tmp_path: Path) -> None:
    """`✓ gpuenv.yaml: valid`, then an error at gpuenv.yaml's `framework`: no more."""
    (tmp_path / "requirements.txt").write_text("numpy\n")
    (tmp_path / "gpuenv.yaml").write_text("name: n\nframework: none\n")
    assert invoke(tmp_path, "lock", *A100).exit_code == 0
    (tmp_path / "gpuenv.yaml").write_text(
        "name: n\nframework: none\nrequirements: [requirements.txt]\n"
    )
    result = invoke(tmp_path, "check")
    assert result.exit_code == 3, result.output
    assert "error: gpuenv.yaml: field 'framework'" in result.stderr
    assert "✓ gpuenv.yaml" not in result.output


@pytest.mark.parametrize("command", [("check",), ("resolve", *A100), ("lock", *A100)])
def test_check_resolve_and_lock_describe_a_bad_file_the_same_way(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    """`resolve` read no dependency file: a requirement pip could not read was exit 3 for
    `check` and `lock`, and an image with exit 0 for `resolve`."""
    (tmp_path / "requirements.txt").write_text("torch==\n")
    (tmp_path / "gpuenv.yaml").write_text(SPEC + "requirements: [requirements.txt]\n")
    result = invoke(tmp_path, *command)
    assert result.exit_code == 3, result.output
    assert "error: requirements.txt:1: 'torch==' is not a valid requirement" in result.stderr


def test_resolve_answers_what_lock_locks(tmp_path: Path) -> None:
    """The project's pins steer `resolve` as they steer `lock`: torch==2.1.2 is 23.10."""
    (tmp_path / "requirements.txt").write_text("torch==2.1.2\n")
    (tmp_path / "gpuenv.yaml").write_text(
        "name: p\nframework: pytorch\nrequirements: [requirements.txt]\n"
    )
    resolved = invoke(tmp_path, "resolve", *A100)
    locked = invoke(tmp_path, "lock", *A100)
    assert resolved.exit_code == locked.exit_code == 0, resolved.output + locked.output
    assert resolved.stdout.strip() == "nvcr.io/nvidia/pytorch:23.10-py3"
    assert "nvcr.io/nvidia/pytorch:23.10-py3" in (tmp_path / "gpuenv.lock").read_text()


@pytest.mark.parametrize("address", ["foo://bar", "/var/run/docker.sock", "npipe:////./pipe/x"])
def test_an_engine_address_gpuenv_cannot_use_is_said_in_its_words(
    tmp_path: Path, address: str
) -> None:
    """It was "cannot reach the Docker engine at foo://bar: is it running?" (exit 10)."""
    result = invoke(tmp_path, "ps", env={"DOCKER_HOST": address})
    assert result.exit_code == 2, result.output
    assert f"DOCKER_HOST={address}:" in result.stderr and "is it running" not in result.stderr
    assert "unix:///path/to/docker.sock" in said(result)


def test_a_home_that_does_not_exist_is_never_created(tmp_path: Path) -> None:
    """A service account's HOME=/nonexistent: gpuenv works without its caches and makes
    no folder there; what needs a folder of the user's says so, with the fix."""
    home = tmp_path / "nonexistent"
    locked(tmp_path)
    env = {"HOME": str(home), "XDG_CACHE_HOME": "", "XDG_STATE_HOME": "", "XDG_DATA_HOME": ""}
    for command in (("matrix", "pytorch"), ("check",), ("resolve", *A100)):
        result = invoke(tmp_path, *command, env=env)
        assert result.exit_code == 0, result.output
    usage = invoke(tmp_path, "usage", env=env)
    if not os.path.exists(SHARED_STATE_DIR):  # else the shared folder serves, no HOME needed
        assert usage.exit_code == 2 and "does not exist" in usage.stderr
        assert "GPUENV_STATE_DIR" in usage.stderr
    assert not home.exists()
