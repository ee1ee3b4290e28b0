"""`gpuenv export`: a value given with -e or --env-file is never printed unless the user
asks for it (--write-values); the exported file names the variable and the scheduler
fills it (a Kubernetes Secret, the environment of `docker compose`)."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner, Result

from gpuenv.cli.tree import main
from gpuenv.cluster.manifests import env_secret
from gpuenv.cluster.submit import exported_environment
from gpuenv.project.validate import load_spec
from tests.unit.fake_engine import lock_packages

from ..conftest import reseal
from .test_cluster import spec

SECRET = "s3cret-token-value"
FROM_FILE = "file-only-value"


@pytest.fixture
def pushed_project(tmp_path: Path) -> Path:
    """A locked project with a push recorded (as `gpuenv push` writes it)."""
    (tmp_path / "requirements.txt").write_text("torch==2.4.0\n")
    (tmp_path / "job.py").write_text("print('hi')\n")
    assert run(tmp_path, "init", "--driver", "550.54.15", "--gpu", "RTX 4090").exit_code == 0
    spec_file = tmp_path / "gpuenv.yaml"
    spec_file.write_text(spec_file.read_text().replace("env: {}", "env:\n  LOG_LEVEL: info"))
    assert run(tmp_path, "lock", "--driver", "550.54.15", "--gpu", "RTX 4090").exit_code == 0
    lock_packages(str(tmp_path))
    lock = tmp_path / "gpuenv.lock"
    digest = "c" * 64
    lock.write_text(
        lock.read_text()
        + f"pushed:\n  reference: r/x:1\n  digest: sha256:{digest}\n  image: r/x@sha256:{digest}\n"
    )
    reseal(lock)
    (tmp_path / "run.env").write_text(f"FROM_FILE={FROM_FILE}\n")
    return tmp_path


def run(project: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["-C", str(project), *args], catch_exceptions=False)


EXPORTS = {
    "kubernetes": ["export", "kubernetes"],
    "compose": ["export", "compose"],
}


@pytest.mark.parametrize("kind", EXPORTS)
def test_values_of_e_and_env_files_are_not_printed(pushed_project: Path, kind: str) -> None:
    result = run(
        pushed_project,
        *EXPORTS[kind],
        "-e",
        f"TOKEN={SECRET}",
        "-e",
        "PASSED",
        "--env-file",
        str(pushed_project / "run.env"),
        "job.py",
    )
    assert result.exit_code == 0, result.output
    assert SECRET not in result.output and FROM_FILE not in result.output
    assert "FROM_FILE, TOKEN, PASSED: no value written" in result.stderr
    documents = list(yaml.safe_load_all(result.stdout))
    if kind == "kubernetes":
        (job,) = documents
        kubernetes_validate.validate(job, "1.29", strict=True)
        env = job["spec"]["template"]["spec"]["containers"][0]["env"]
        by_name = {entry["name"]: entry for entry in env}
        assert by_name["LOG_LEVEL"] == {"name": "LOG_LEVEL", "value": "info"}  # the spec's
        secret = {"name": env_secret(load_spec(str(pushed_project))), "key": "TOKEN"}
        assert by_name["TOKEN"]["valueFrom"] == {"secretKeyRef": secret}
        assert "value" not in by_name["FROM_FILE"] and "value" not in by_name["PASSED"]
        assert "kubectl create secret generic" in result.stderr
    else:
        (compose,) = documents
        (service,) = compose["services"].values()
        environment = service["environment"]
        assert environment["LOG_LEVEL"] == "info"
        assert environment["TOKEN"] is None and environment["FROM_FILE"] is None
        assert environment["PASSED"] is None


@pytest.mark.parametrize("kind", EXPORTS)
def test_write_values_writes_them_when_asked(pushed_project: Path, kind: str) -> None:
    result = run(pushed_project, *EXPORTS[kind], "--write-values", "-e", f"TOKEN={SECRET}", "x")
    assert result.exit_code == 0, result.output
    assert SECRET in result.stdout and "no value written" not in result.stderr
    refused = run(pushed_project, *EXPORTS[kind], "--write-values", "-e", "TOKEN", "x")
    assert refused.exit_code == 2 and "has no value to write" in refused.stderr


def test_the_env_secret_is_named_by_option_and_checked(pushed_project: Path) -> None:
    named = run(
        pushed_project, "export", "kubernetes", "--env-secret", "team-env", "-e", "A=1", "x"
    )
    assert named.exit_code == 0, named.output
    assert "name: team-env" in named.stdout and "team-env" in named.stderr
    bad = run(pushed_project, "export", "kubernetes", "--env-secret", "Team_Env", "-e", "A=1", "x")
    assert bad.exit_code == 2 and "--env-secret 'Team_Env'" in bad.stderr


def test_compose_exports_the_pushed_image(pushed_project: Path) -> None:
    result = run(pushed_project, "export", "compose", "job.py")
    assert result.exit_code == 0, result.output
    (service,) = yaml.safe_load(result.stdout)["services"].values()
    assert service["image"] == "r/x@sha256:" + "c" * 64


@pytest.mark.parametrize(
    ("options", "write_values", "written", "referenced"),
    [
        (["A=1"], False, {"MODE": "it's fast"}, ["A"]),
        (["MODE=slow"], False, {}, ["MODE"]),  # -e overrides the spec: its value stays out
        (["B"], False, {"MODE": "it's fast"}, ["B"]),
        (["A=1", "MODE=slow"], True, {"MODE": "slow", "A": "1"}, []),
    ],
)
def test_exported_environment(
    options: list[str], write_values: bool, written: dict, referenced: list[str]
) -> None:
    variables = exported_environment(spec(), options, [], write_values=write_values)
    assert (variables.written, variables.referenced) == (written, referenced)


def test_a_bare_key_in_an_env_file_is_named_like_a_bare_e(tmp_path: Path) -> None:
    """`KEY` alone on a line of --env-file passes the value from the environment, as
    `-e KEY` does: the job (and an export) names it rather than losing it."""
    from gpuenv.cluster.submit import job_environment

    env_file = tmp_path / "run.env"
    env_file.write_text("# comment\nMODE=fast\nWANDB_API_KEY\n")
    job = job_environment(spec(), ["LOG=1"], [str(env_file)])
    assert job.names == ["MODE", "LOG", "WANDB_API_KEY"]
    assert job.values == {"MODE": "fast", "LOG": "1"} and job.written == {}
    exported = exported_environment(spec(), [], [str(env_file)])
    assert exported.referenced == ["MODE", "WANDB_API_KEY"]


def test_write_values_refuses_a_bare_key_of_an_env_file(tmp_path: Path) -> None:
    """With --write-values, a bare KEY line has no value to write: refused, as a bare
    -e KEY is, not dropped without a word."""
    from gpuenv.errors import UsageError

    env_file = tmp_path / "run.env"
    env_file.write_text("A=1\nTOKEN\n")
    with pytest.raises(UsageError, match="TOKEN"):
        exported_environment(spec(), [], [str(env_file)], write_values=True)
    (tmp_path / "ok.env").write_text("A=1\n")
    written = exported_environment(spec(), ["B=2"], [str(tmp_path / "ok.env")], write_values=True)
    assert written.written == {"MODE": "it's fast", "A": "1", "B": "2"}


@pytest.mark.parametrize(
    ("env", "referenced"),
    [({"CUDA_DEVICE_ORDER": "FASTEST_FIRST", "A": "1"}, []), ({"A": "1"}, ["CUDA_DEVICE_ORDER"])],
)
def test_the_jobs_device_order_is_given_once(env: dict[str, str], referenced: list[str]) -> None:
    from gpuenv.cluster.manifests import _env_list

    listed = _env_list(env, referenced, "s")
    names = [e["name"] for e in listed]
    assert names.count("CUDA_DEVICE_ORDER") == 1 and len(names) == len(set(names))
    assert {"name": "CUDA_DEVICE_ORDER", "value": "PCI_BUS_ID"} in listed


@pytest.mark.parametrize(
    ("gpus", "reservation"),
    [
        ("0,2", {"driver": "nvidia", "capabilities": ["gpu"], "device_ids": ["0", "2"]}),
        ("2", {"driver": "nvidia", "capabilities": ["gpu"], "count": 2}),
    ],
)
def test_compose_takes_a_count_or_device_ids(
    pushed_project: Path, gpus: str, reservation: dict[str, object]
) -> None:
    """`export compose --gpus 0,2` (issue 31): device ids, as `gpuenv run --gpus 0,2`."""
    result = run(pushed_project, "export", "compose", "--gpus", gpus, "job.py")
    assert result.exit_code == 0, result.output
    (service,) = yaml.safe_load(result.stdout)["services"].values()
    assert service["deploy"]["resources"]["reservations"]["devices"] == [reservation]
    bad = CliRunner().invoke(
        main, ["-C", str(pushed_project), "export", "compose", "--gpus", "0,,2", "job.py"]
    )
    assert bad.exit_code == 2 and "a count (2) or device ids" in bad.stderr
