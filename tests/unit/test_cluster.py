"""Golden files for the Slurm scripts; the Kubernetes Job against Kubernetes' schema; the
Compose service's GPU reservation."""

from __future__ import annotations

import os
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from gpuenv.cluster.manifests import compose_file, kubernetes_manifests
from gpuenv.cluster.slurm import Launch, pushed_image, sbatch_script
from gpuenv.errors import UsageError
from gpuenv.project.spec import spec_from_data

GOLDEN = Path(__file__).parent / "golden"
IMAGE = "registry.example.com/team/demo@sha256:" + "ab" * 32
UPDATE = os.environ.get("GPUENV_UPDATE_GOLDEN") == "1"


def spec(gpus: object = 2):
    data = {
        "name": "demo",
        "framework": "pytorch",
        "version": "2.4",
        "python": None,
        "cuda": None,
        "base": "ngc",
        "requirements": [],
        "packages": [],
        "apt": [],
        "env": {"MODE": "it's fast"},
        "gpus": gpus,
        "shm_size": 16 * 1024**3,
        "ipc": None,
        "mounts": [],
    }
    return spec_from_data(data, "/srv/projects/demo", "/srv/projects/demo/gpuenv.yaml")


def kubernetes_job(*args, **kwargs) -> dict:
    """The Job of a single-node export (the only manifest)."""
    (job,) = kubernetes_manifests(*args, **kwargs)
    return job


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.write_text(text)
    assert text == path.read_text()


@pytest.mark.parametrize("nodes", [1, 2])
@pytest.mark.parametrize("launcher", ["docker", "pyxis", "apptainer"])
def test_sbatch_golden(launcher: str, nodes: int) -> None:
    script = sbatch_script(
        spec(),
        IMAGE,
        ["python3", "train.py", "--name", "a b; rm -rf ~"],
        {"MODE": "it's fast"},
        passthrough=["WANDB_API_KEY"],
        gpus=2,
        output_dir="/srv/projects/demo/.gpuenv/slurm",
        shm_size=16 * 1024**3,
        launch=Launch(launcher, nodes, 600, "/shared/sif-cache"),
        time_limit="04:00:00",
        partition="gpu",
        extra=["--mem=64G"],
    )
    golden(f"{launcher}.sbatch" if nodes == 1 else f"{launcher}-{nodes}-nodes.sbatch", script)


@pytest.mark.parametrize("argument", ["--mem=1G\n#SBATCH --uid=0", "mem=1G"])
def test_sbatch_args_are_checked(argument: str) -> None:
    with pytest.raises(UsageError, match="--sbatch-arg"):
        sbatch_script(
            spec(), IMAGE, ["true"], {}, gpus=1, output_dir="/x", shm_size=1, extra=[argument]
        )


def test_push_first() -> None:
    with pytest.raises(UsageError, match="has not been pushed"):
        pushed_image({})
    assert pushed_image({"pushed": {"image": IMAGE}}) == IMAGE


def test_kubernetes_job_is_valid() -> None:
    manifest = kubernetes_job(
        spec(),
        IMAGE,
        ["python3", "train.py"],
        {"MODE": "fast"},
        gpus=2,
        shm_size=16 * 1024**3,
        uid=1234,
        gid=1234,
    )
    kubernetes_validate.validate(manifest, "1.29", strict=True)
    pod = manifest["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == IMAGE and container["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert pod["restartPolicy"] == "Never" and manifest["spec"]["backoffLimit"] == 0
    assert (
        pod["securityContext"]["runAsUser"] == 1234
        and pod["securityContext"]["runAsNonRoot"] is True
    )
    assert pod["volumes"][0]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16384Mi"}
    assert "&" not in yaml.safe_dump(manifest)  # no YAML anchors


def test_kubernetes_job_never_root() -> None:
    manifest = kubernetes_job(spec(), IMAGE, ["true"], {}, gpus=0, shm_size=2**30, uid=0, gid=0)
    assert manifest["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 1000
    assert "resources" not in manifest["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize(
    ("gpus", "devices", "expected"),
    [
        (2, [], {"driver": "nvidia", "capabilities": ["gpu"], "count": 2}),
        (None, ["0", "2"], {"driver": "nvidia", "capabilities": ["gpu"], "device_ids": ["0", "2"]}),
    ],
)
def test_compose_gpus_name_count_or_devices(
    gpus: int | None, devices: list[str], expected: dict
) -> None:
    service = compose_file(
        spec(),
        IMAGE,
        ["true"],
        {},
        gpus=gpus,
        device_ids=devices,
        shm_size=2**30,
        uid=1000,
        gid=1000,
    )["services"]["demo"]
    assert service["deploy"]["resources"]["reservations"]["devices"] == [expected]
    assert service["user"] == "1000:1000" and service["init"] is True


def test_compose_without_gpus_has_no_reservation() -> None:
    service = compose_file(
        spec("none"), IMAGE, ["true"], {}, gpus=0, device_ids=[], shm_size=2**30, uid=0, gid=0
    )["services"]["demo"]
    assert "deploy" not in service and "user" not in service


@pytest.mark.parametrize(
    ("platform", "machine"), [("linux/arm64", "aarch64"), ("linux/amd64", "x86_64")]
)
@pytest.mark.parametrize("launcher", ["docker", "pyxis", "apptainer"])
def test_the_job_checks_the_nodes_platform_first(
    launcher: str, platform: str, machine: str
) -> None:
    """An amd64 image on a GH200 node fails with "exec format error" otherwise."""
    script = sbatch_script(
        spec(),
        IMAGE,
        ["true"],
        {},
        gpus=1,
        output_dir="/x",
        shm_size=1,
        launch=Launch(launcher, sif_cache="/sif"),
        platform=platform,
    )
    check = script.index('if [ "$(uname -m)" != ' + machine + " ]")
    assert check < script.index("exec ")
    assert f"the image is built for {platform}" in script
    unknown = sbatch_script(
        spec(),
        IMAGE,
        ["true"],
        {},
        gpus=1,
        output_dir="/x",
        shm_size=1,
        launch=Launch(launcher, sif_cache="/sif"),
    )
    assert "uname -m" not in unknown


def test_the_node_platform_check_runs_in_a_shell(tmp_path: Path) -> None:
    """The generated check itself, run by bash with a stand-in uname."""
    import subprocess

    from gpuenv.cluster.slurm import _platform_check

    fake = tmp_path / "uname"
    fake.write_text("#!/bin/sh\necho aarch64\n")
    fake.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    refused = subprocess.run(
        ["bash", "-c", _platform_check("linux/amd64") + "echo ran"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 1 and "ran" not in refused.stdout
    assert "built for linux/amd64; this node is aarch64" in refused.stderr
    allowed = subprocess.run(
        ["bash", "-c", _platform_check("linux/arm64") + "echo ran"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert allowed.returncode == 0 and allowed.stdout == "ran\n"


def test_kubernetes_and_compose_name_the_images_platform() -> None:
    manifest = kubernetes_job(
        spec(),
        IMAGE,
        ["true"],
        {},
        gpus=1,
        shm_size=2**30,
        uid=1234,
        gid=1234,
        platform="linux/arm64",
    )
    kubernetes_validate.validate(manifest, "1.29", strict=True)
    assert manifest["spec"]["template"]["spec"]["nodeSelector"] == {"kubernetes.io/arch": "arm64"}
    unknown = kubernetes_job(spec(), IMAGE, ["true"], {}, gpus=1, shm_size=2**30, uid=1, gid=1)
    assert "nodeSelector" not in unknown["spec"]["template"]["spec"]
    service = compose_file(
        spec(),
        IMAGE,
        ["true"],
        {},
        gpus=1,
        device_ids=[],
        shm_size=1,
        uid=1,
        gid=1,
        platform="linux/amd64",
    )["services"]["demo"]
    assert service["platform"] == "linux/amd64"


def test_job_values_are_named_never_written(tmp_path: Path) -> None:
    from gpuenv.cluster.submit import job_environment

    env_file = tmp_path / "vars.env"
    env_file.write_text("FROM_FILE=file-secret\n")
    variables = job_environment(
        spec(), ["TOKEN=hunter2", "MODE=override", "WANDB_API_KEY"], [str(env_file)]
    )
    assert variables.values == {
        "FROM_FILE": "file-secret",
        "TOKEN": "hunter2",
        "MODE": "override",
    }
    assert variables.names == ["FROM_FILE", "TOKEN", "MODE", "WANDB_API_KEY"]
    assert variables.written == {}  # the spec's MODE is overridden: not written either
    from gpuenv.cluster.slurm import Launch

    for launcher in ("docker", "pyxis", "apptainer"):
        for nodes in (None, 2):
            script = sbatch_script(
                spec(),
                IMAGE,
                ["true"],
                variables.written,
                passthrough=variables.names,
                gpus=1,
                output_dir="/x",
                shm_size=1,
                launch=Launch(launcher=launcher, nodes=nodes, sif_cache="/cache/sif"),
            )
            assert "hunter2" not in script and "file-secret" not in script
            assert "override" not in script and "it's fast" not in script
            if launcher == "docker":
                assert "-e TOKEN -e MODE -e WANDB_API_KEY" in script
            if launcher == "apptainer":  # copied from the job's environment when it runs
                assert 'export APPTAINERENV_TOKEN="${TOKEN-}"' in script


def test_submit_writes_a_private_script_and_passes_values_in_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sbatch here is a stand-in that records what it got (the real one: test_cluster.py
    in tests/integration)."""
    import stat

    from gpuenv.cluster.submit import submit_script

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    seen = tmp_path / "seen"
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(
        f'#!/bin/sh\nstat -c %a "$2" > {seen}\necho "TOKEN=$TOKEN" >> {seen}\necho 42\n'
    )
    sbatch.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    output = tmp_path / "project" / ".gpuenv" / "slurm"
    output.mkdir(parents=True, mode=0o755)
    submitted = submit_script(
        str(tmp_path / "project"), str(output), "demo", "#!/bin/bash\ntrue\n", {"TOKEN": "s3"}
    )
    assert submitted.job == "42"
    assert seen.read_text() == "600\nTOKEN=s3\n"
    assert stat.S_IMODE(os.stat(submitted.script).st_mode) == 0o600
    assert stat.S_IMODE(output.stat().st_mode) == 0o700
    assert "s3" not in Path(submitted.script).read_text()


@pytest.mark.parametrize("sacct", ["rows", "no accounting", "missing"])
def test_jobs_are_the_queued_then_the_ended_each_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sacct: str
) -> None:
    """`gpuenv jobs`' rows (app.submit.list_jobs): squeue's, then sacct's ended jobs not
    among them; where sacct cannot say, the queued ones and why the ended are missing.
    squeue and sacct here are stand-ins (the real ones: tests/integration/test_cluster.py)."""
    from click.testing import CliRunner

    from gpuenv.app.submit import list_jobs
    from gpuenv.cli.tree import main

    project = tmp_path / "project"
    project.mkdir()
    init = ["-C", str(project), "init", "--driver", "550.54.15", "--gpu", "RTX 4090"]
    assert CliRunner().invoke(main, init).exit_code == 0
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    asked = tmp_path / "asked"
    scripts = {"squeue": f'echo "$@" > {asked}\necho "17|RUNNING|1:02|1|node1"\n'}
    if sacct == "rows":  # 17 ended between the two calls: shown once, as squeue saw it
        scripts["sacct"] = (
            "echo '17|COMPLETED|00:01:03|1|node1|0:0'\necho '16|FAILED|00:00:02|1|node1|1:0'\n"
        )
    elif sacct == "no accounting":
        scripts["sacct"] = "echo 'Slurm accounting storage is disabled' >&2\nexit 1\n"
    for name, body in scripts.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))

    listed = list_jobs(str(project))

    assert f"--name={listed.name}" in asked.read_text().split()
    queued = {"job": "17", "state": "RUNNING", "time": "1:02", "nodes": "1", "where": "node1"}
    if sacct == "rows":
        failed = {**queued, "job": "16", "state": "FAILED", "time": "00:00:02", "exit_code": "1:0"}
        assert (listed.rows, listed.not_shown) == ([queued, failed], None)
    else:
        assert listed.rows == [queued]
        reason = "sacct is not on PATH" if sacct == "missing" else "keeps no Slurm accounting"
        assert listed.not_shown is not None and reason in listed.not_shown
