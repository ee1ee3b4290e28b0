"""The CLI end to end (in-process), with described hosts: exit codes, files, messages."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from gpuenv.cli.tree import main
from tests.scripted_nvml import ScriptedNvml, gpu, scenario
from tests.unit.fake_engine import lock_packages

from ..conftest import reseal

RTX4090_OLD = ["--driver", "535.104.05", "--gpu", "RTX 4090"]
RTX4090_OK = ["--driver", "550.54.15", "--gpu", "RTX 4090"]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "requirements.txt").write_text("torch==2.4.0\nnumpy\n")
    return tmp_path


def run(project: Path, *args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, ["-C", str(project), *args], env=env, catch_exceptions=False)


def test_help_lists_commands_and_exit_codes() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    for word in ("init", "resolve", "lock", "check", "matrix", "Exit codes:", "130  interrupted"):
        assert word in result.output


def test_init_writes_spec_and_lock(project: Path) -> None:
    result = run(project, "init", *RTX4090_OK)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "nvcr.io/nvidia/pytorch:24.06-py3"
    assert "found requirements.txt:1: torch==2.4.0" in result.stderr
    assert 'version: "2.4"' in (project / "gpuenv.yaml").read_text()
    assert "reference: nvcr.io/nvidia/pytorch:24.06-py3" in (project / "gpuenv.lock").read_text()
    # No engine here: the Python packages are not locked yet, and --check says so.
    assert "resolved: false" in (project / "gpuenv.lock").read_text()
    checked = run(project, "lock", "--check")
    assert checked.exit_code == 5
    assert "the Python packages on the image are not locked" in checked.stderr
    lock_packages(str(project))
    assert run(project, "lock", "--check").exit_code == 0


def test_init_refuses_to_overwrite(project: Path) -> None:
    assert run(project, "init", *RTX4090_OK).exit_code == 0
    before = (project / "gpuenv.yaml").read_text()
    result = run(project, "init", "--framework", "jax")
    assert result.exit_code == 2
    assert "gpuenv.yaml and gpuenv.lock already exist" in result.stderr
    assert "--force" in result.stderr
    assert (project / "gpuenv.yaml").read_text() == before
    assert run(project, "init", "--force", "--framework", "jax").exit_code == 0
    assert "framework: jax" in (project / "gpuenv.yaml").read_text()


def test_init_unresolvable_writes_spec_but_no_lock(project: Path) -> None:
    result = run(project, "init", *RTX4090_OLD)
    assert result.exit_code == 4
    assert (project / "gpuenv.yaml").exists() and not (project / "gpuenv.lock").exists()
    assert "needs driver ≥ 545 (this host has 535.104.05)" in result.stderr
    assert "Traceback" not in result.output


def test_resolve_json(project: Path) -> None:
    result = run(
        project, "resolve", "--framework", "pytorch", "--version", "2.4", "--json", *RTX4090_OK
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    # 24.06 "requires NVIDIA Driver release 545 or later" (Triton rel-24-06), so 550 runs it.
    assert data["image"] == "nvcr.io/nvidia/pytorch:24.06-py3"
    assert data["framework"] == "pytorch"
    assert data["framework_version"] == "2.4.0a0+f70bd71a48"
    assert (data["cuda"], data["python"], data["min_driver"]) == ("12.5.0", "3.10", "545")
    assert data["host"]["driver"] == "550.54.15"


def test_resolve_failure_goes_to_stderr_and_json_to_stdout(project: Path) -> None:
    """People read the failure on stderr; with --json, scripts get it on stdout too
    (issue 12: stdout was empty)."""
    result = run(
        project, "resolve", "--framework", "pytorch", "--version", "2.4", "--json", *RTX4090_OLD
    )
    assert result.exit_code == 4
    failure = json.loads(result.stdout)
    assert failure["exit_code"] == 4 and failure["error"]["hint"].startswith("Upgrade the NVIDIA")
    assert "hint: Upgrade the NVIDIA driver to ≥ 545" in result.stderr
    assert "PyTorch ≤ 2.1" in result.stderr


def test_resolve_explain_lists_candidates(project: Path) -> None:
    result = run(
        project, "resolve", "--framework", "pytorch", "--version", "2.4", "--explain", *RTX4090_OK
    )
    assert result.exit_code == 0
    assert "chosen" in result.stdout and "24.06-py3" in result.stdout
    assert "24.07-py3" in result.stdout  # rejected candidates are listed too


def test_resolve_without_spec_needs_framework(project: Path) -> None:
    result = run(project, "resolve")
    assert result.exit_code == 2
    assert "no gpuenv.yaml in" in result.stderr and "gpuenv init" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["resolve", "--framework", "pytorch", "--cuda", "12.x"],
            "--cuda: '12.x' is not a version",
        ),
        (
            ["resolve", "--framework", "pytorch", "--driver", "abc"],
            "--driver: 'abc' is not a driver version",
        ),
        (
            ["resolve", "--framework", "pytorch", "--driver", "535.1", "--gpu", "Voodoo 5"],
            "--gpu 'Voodoo 5': not a GPU model",
        ),
        (
            ["resolve", "--framework", "pytorch", "--gpu", "A100"],
            "--gpu needs --driver too",
        ),
        (["lock", "--check", "--upgrade"], "cannot be combined"),
        (["lock", "--driver", "r535"], "--driver: 'r535' is not a driver version"),
        (["init", "--force", "--driver", "535.1", "--gpu", "Voodoo 5"], "not a GPU model"),
    ],
)
def test_usage_errors(project: Path, args: list[str], message: str) -> None:
    """A bad flag value is exit 2 whatever the flag (issue 12: --driver/--gpu were 7)."""
    (project / "gpuenv.yaml").write_text("framework: pytorch\n")
    result = run(project, *args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert "Traceback" not in result.output


def test_invalid_spec_exit_3(project: Path) -> None:
    (project / "gpuenv.yaml").write_text("framework: pytorch\ncuda: 12.x\nshm: 8g\n")
    result = run(project, "resolve")
    assert result.exit_code == 3
    assert "gpuenv.yaml:2:1: field 'cuda': '12.x' is not a version" in result.stderr
    assert (
        "gpuenv.yaml:3:1: field 'shm': unknown field 'shm'; did you mean 'shm_size'?"
        in result.stderr
    )


def test_debug_shows_traceback(project: Path) -> None:
    (project / "gpuenv.yaml").write_text("framework: pytorch\ncuda: 12.x\n")
    result = CliRunner().invoke(main, ["--debug", "-C", str(project), "resolve"])
    assert result.exit_code == 3
    assert "Traceback" in result.stderr


def test_lock_check_and_update_cycle(project: Path) -> None:
    assert run(project, "init", *RTX4090_OK).exit_code == 0
    lock_packages(str(project))
    spec = project / "gpuenv.yaml"
    lock = project / "gpuenv.lock"
    digest = "sha256:" + "ab" * 32
    lock.write_text(lock.read_text().replace("digest: ''", f"digest: {digest}"))
    reseal(lock)  # as `gpuenv pull` writes it

    # An unrelated edit: --check fails and says why; `lock` keeps image and digest.
    spec.write_text(spec.read_text().replace("apt: []", "apt: [git]"))
    result = run(project, "lock", "--check")
    assert result.exit_code == 5
    assert "gpuenv.yaml changed since the lock was written" in result.stderr
    result = run(project, "lock", *RTX4090_OK)
    assert result.exit_code == 0, result.output
    assert "the image is unchanged" in result.stderr
    assert digest in lock.read_text()
    assert run(project, "lock", "--check").exit_code == 0
    assert "is up to date" in run(project, "lock").stderr

    # A requirements change is caught too.
    (project / "requirements.txt").write_text("torch==2.4.0\nnumpy\nscipy\n")
    result = run(project, "lock", "--check")
    assert result.exit_code == 5 and "requirements file requirements.txt changed" in result.stderr

    # --upgrade moves to the newest image that fits; the digest of the old image is dropped.
    # (the requirements pin torch too: they steer the image as much as the spec does)
    spec.write_text(spec.read_text().replace('version: "2.4"', 'version: ">=2.4"'))
    (project / "requirements.txt").write_text("torch>=2.4.0\nnumpy\nscipy\n")
    result = run(project, "lock", "--upgrade", "--driver", "580.95.05", "--gpu", "RTX 4090")
    assert result.exit_code == 0
    assert "nvcr.io/nvidia/pytorch:24.06-py3 → nvcr.io/nvidia/pytorch:26.09-py3" in result.stderr
    assert "digest: ''" in lock.read_text()


def test_unresolvable_lock_leaves_the_old_lock(project: Path) -> None:
    assert run(project, "init", *RTX4090_OK).exit_code == 0
    lock = project / "gpuenv.lock"
    before = lock.read_text()
    spec = project / "gpuenv.yaml"
    spec.write_text(spec.read_text().replace('version: "2.4"', 'version: "9.9"'))
    result = run(project, "lock", *RTX4090_OK)
    assert result.exit_code == 4
    assert lock.read_text() == before


def test_damaged_lock_is_rewritten(project: Path) -> None:
    assert run(project, "init", *RTX4090_OK).exit_code == 0
    (project / "gpuenv.lock").write_text("lock_version: [\n")
    assert run(project, "lock", "--check").exit_code == 5
    result = run(project, "lock", *RTX4090_OK)
    assert result.exit_code == 0
    assert "is damaged" in result.stderr
    lock_packages(str(project))
    assert run(project, "lock", "--check").exit_code == 0


def test_check(project: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    assert run(project, "init", *RTX4090_OK).exit_code == 0
    result = run(project, "check")
    assert result.exit_code == 0, result.output
    assert "gpuenv.yaml: valid" in result.stderr and "gpuenv.lock: matches" in result.stderr

    (project / "gpuenv.yaml").write_text("framework: pytorch\nversion: '2.5'\n")
    result = run(project, "check")
    assert result.exit_code == 5 and "out of date" in result.stderr

    (project / "gpuenv.yaml").write_text("framework: pytorch\ngpus: 0\n")
    result = run(project, "check")
    assert result.exit_code == 3 and "a GPU count must be at least 1" in result.stderr

    broken = tmp_path_factory.mktemp("matrices")
    (broken / "x.yaml").write_text("schema: 2\n")
    result = run(project, "check", env={"GPUENV_MATRIX_DIR": str(broken)})
    assert result.exit_code == 6 and "schema 2 is not supported" in result.stderr


def test_check_reads_the_dependency_files_once(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock's up-to-date test (file hashes) and the install plan come from one reading."""
    import gpuenv.project.dependencies as dependencies

    assert run(project, "init", *RTX4090_OK).exit_code == 0
    (project / "requirements.txt").write_text("torch==2.4.0\nnumpy\n-r more.txt\n")
    (project / "more.txt").write_text("rich\n")
    assert run(project, "lock", *RTX4090_OK).exit_code == 0
    readings: list[tuple[str, ...]] = []
    read_sources = dependencies.read_sources

    def counted(project_dir: str, sources: tuple[str, ...], **kwargs: object) -> object:
        readings.append(tuple(sources))
        return read_sources(project_dir, sources, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(dependencies, "read_sources", counted)
    result = run(project, "check")
    assert result.exit_code == 0, result.output
    assert "gpuenv.lock: matches" in result.stderr and "2 file(s) read" in result.stderr
    assert readings == [("requirements.txt",)]
    (project / "more.txt").write_text("rich\nhttpx\n")
    result = run(project, "check")
    assert result.exit_code == 5 and "requirements file more.txt changed" in result.stderr


def test_bad_host_file_exit_7(project: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    host_file = tmp_path_factory.mktemp("h") / "host.json"
    host_file.write_text('{"driver": 535}')
    result = run(
        project, "resolve", "--framework", "pytorch", env={"GPUENV_HOST_FILE": str(host_file)}
    )
    assert result.exit_code == 7
    assert "expected a quoted driver version" in result.stderr


def test_nvml_host_is_used(project: Path, nvml: ScriptedNvml) -> None:
    """The twin of test_host_file_is_used: the same host, detected through NVML."""
    nvml.write(scenario(gpu(0), driver="535.104.05", cuda=12020))
    result = run(project, "resolve", "--framework", "pytorch", "--version", "2.4")
    assert result.exit_code == 0
    assert result.stdout.strip() == "nvcr.io/nvidia/pytorch:24.07-py3"
    assert "forward compatibility" in result.stderr
    explained = run(project, "resolve", "--framework", "pytorch", "--version", "2.4", "--explain")
    assert (
        "driver 535.104.05, NVIDIA A100-SXM4-80GB (detected through NVML)" in explained.output
    )  # the table title (stderr when piped)


def test_host_file_is_used(project: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    host_file = tmp_path_factory.mktemp("h") / "host.json"
    host_file.write_text(json.dumps({"driver": "535.104.05", "gpus": ["NVIDIA A100-SXM4-80GB"]}))
    result = run(
        project,
        "resolve",
        "--framework",
        "pytorch",
        "--version",
        "2.4",
        env={"GPUENV_HOST_FILE": str(host_file)},
    )
    assert result.exit_code == 0
    # 24.07 lists R535 >= 535.86 for data-center GPUs (Triton rel-24-07).
    assert result.stdout.strip() == "nvcr.io/nvidia/pytorch:24.07-py3"
    assert "forward compatibility" in result.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["matrix"], "pytorch"),
        (["matrix", "pytorch"], "nvcr.io/nvidia/pytorch:24.05-py3"),
        (["matrix", "gpus"], "RTX 4090"),
        (["matrix", "cuda"], "12.8 GA"),
    ],
)
def test_matrix_tables(project: Path, args: list[str], expected: str) -> None:
    result = CliRunner().invoke(main, args, env={"COLUMNS": "250"})
    assert result.exit_code == 0
    assert expected in result.stdout


def test_matrix_json() -> None:
    result = CliRunner().invoke(main, ["matrix", "pytorch", "--json"])
    rows = json.loads(result.stdout)
    assert rows[0]["tag"] == "26.10-py3"
    assert {"framework_version", "cuda", "min_driver", "evidence", "unverified"} <= set(rows[0])
    gpus = json.loads(CliRunner().invoke(main, ["matrix", "gpus", "--json"]).stdout)
    assert any(g["name"] == "A100" and g["class"] == "datacenter" for g in gpus)
    cuda = json.loads(CliRunner().invoke(main, ["matrix", "cuda", "--json"]).stdout)
    assert {"minor_version_compat", "toolkits", "compute_capabilities"} == set(cuda)


def test_directory_option(project: Path) -> None:
    result = CliRunner().invoke(main, ["-C", str(project / "missing"), "check"])
    assert result.exit_code == 2
    assert os.path.isdir(project)


def test_lock_without_gpu_plans_for_the_recorded_host(project: Path) -> None:
    # Locked on an RTX 4090 server with driver 550; edited later on a laptop without GPUs.
    assert run(project, "init", *RTX4090_OK).exit_code == 0
    spec = project / "gpuenv.yaml"
    spec.write_text(spec.read_text().replace('version: "2.4"', 'version: ">=2.4"'))
    result = run(project, "lock", "--upgrade")
    assert result.exit_code == 0, result.output
    assert "planning for the host in the lock" in result.stderr
    # Not 26.09: the recorded driver 550 caps it at the newest image that driver runs
    # (24.06: "requires NVIDIA Driver release 545 or later", Triton rel-24-06).
    assert result.stdout.strip() == "nvcr.io/nvidia/pytorch:24.06-py3"
    lock = (project / "gpuenv.lock").read_text()
    assert "driver: 550.54.15" in lock and "compute_capability: '8.9'" in lock


def test_host_flags_re_resolve_an_up_to_date_lock(project: Path) -> None:
    assert run(project, "init", *RTX4090_OK).exit_code == 0
    result = run(project, "lock", *RTX4090_OLD)
    assert result.exit_code == 4
    assert "needs driver ≥ 545" in result.stderr


def test_driver_without_gpus_warns(project: Path) -> None:
    result = run(project, "resolve", "--framework", "pytorch", "--driver", "580.95.05")
    assert result.exit_code == 0
    assert "compute-capability checks were skipped" in result.stderr


def test_lock_keeps_the_push_record_only_while_the_spec_holds(project: Path) -> None:
    assert run(project, "init", *RTX4090_OK).exit_code == 0
    lock = project / "gpuenv.lock"
    pushed = (
        "pushed:\n  reference: r/x:1\n  digest: sha256:"
        + "c" * 64
        + "\n  image: r/x@sha256:"
        + "c" * 64
        + "\n"
    )
    lock.write_text(lock.read_text() + pushed)
    reseal(lock)  # as `gpuenv push` writes it
    assert run(project, "lock", "--driver", "555.42.02", "--gpu", "RTX 4090").exit_code == 0
    assert "reference: r/x:1" in lock.read_text()  # re-resolved for a host: same image, push holds
    spec = project / "gpuenv.yaml"
    spec.write_text(spec.read_text().replace("apt: []", "apt: [git]"))
    assert run(project, "lock", *RTX4090_OK).exit_code == 0
    assert "pushed:" not in lock.read_text()  # a new spec: the pushed image no longer matches it
