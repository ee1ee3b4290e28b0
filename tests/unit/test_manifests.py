"""Kubernetes exports as clusters run them now (Kueue, Indexed Jobs, MIG, pull secrets),
each manifest validated with kubernetes-validate --strict against every Kubernetes
version the docs claim; the launchers' names for the pushed image."""

from __future__ import annotations

import subprocess
import sys

import kubernetes_validate
import pytest
import yaml

from gpuenv.cluster.images import PinnedImage, check_enroot_uri
from gpuenv.cluster.manifests import (
    KUEUE_QUEUE_LABEL,
    KubernetesOptions,
    kubernetes_manifests,
)
from gpuenv.cluster.submit import parse_sacct
from gpuenv.errors import UsageError

from .test_cluster import IMAGE, spec

# The Kubernetes versions docs/reference/clusters.md claims the Job works on.
KUBERNETES_VERSIONS = ("1.29", "1.30", "1.31", "1.32", "1.33", "1.34", "1.35", "1.36", "1.37")

DIGEST = "sha256:" + "ab" * 32
OPTIONS = {
    "plain": KubernetesOptions(),
    "queued": KubernetesOptions(queue="team-a-queue"),
    "two-nodes": KubernetesOptions(nodes=2, rendezvous_timeout=120),
    "mig": KubernetesOptions(mig="1g.10gb", pull_secrets=("regcred", "ngc")),
    "everything": KubernetesOptions(
        queue="user-queue", nodes=16, mig="3g.40gb", pull_secrets=("regcred",)
    ),
}


def manifests(options: KubernetesOptions, gpus: int = 2) -> list[dict]:
    return kubernetes_manifests(
        spec(),
        IMAGE,
        ["python3", "train.py", "--lr", "3e-4"],
        {"MODE": "fast"},
        gpus=gpus,
        shm_size=2**30,
        uid=1234,
        gid=1234,
        platform="linux/amd64",
        options=options,
    )


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("case", list(OPTIONS))
def test_every_manifest_passes_strict_validation(case: str, version: str) -> None:
    for document in manifests(OPTIONS[case]):
        kubernetes_validate.validate(document, version, strict=True)


def test_the_printed_yaml_passes_the_cli(tmp_path) -> None:
    """kubernetes-validate --strict itself, on the YAML as `gpuenv export kubernetes`
    prints it (several documents in one file), oldest and newest version claimed."""
    documents = [d for options in OPTIONS.values() for d in manifests(options)]
    path = tmp_path / "export.yaml"
    path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    for version in (KUBERNETES_VERSIONS[0], KUBERNETES_VERSIONS[-1]):
        checked = subprocess.run(
            [sys.executable, "-m", "kubernetes_validate", "--strict", "-k", version, str(path)],
            capture_output=True,
            text=True,
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert checked.stdout.count("passed") == len(documents), checked.stdout


def test_the_strict_check_can_fail(tmp_path) -> None:
    """A field Kubernetes does not know fails the same check the exports pass."""
    (job,) = manifests(KubernetesOptions())
    job["spec"]["template"]["spec"]["containers"][0]["gpus"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, KUBERNETES_VERSIONS[0], strict=True)


def test_kueue_queue_label_and_suspend() -> None:
    (job,) = manifests(OPTIONS["queued"])
    assert job["metadata"]["labels"][KUEUE_QUEUE_LABEL] == "team-a-queue"
    assert job["spec"]["suspend"] is True
    (plain,) = manifests(OPTIONS["plain"])
    assert KUEUE_QUEUE_LABEL not in plain["metadata"]["labels"]
    assert "suspend" not in plain["spec"]


def test_several_nodes_are_an_indexed_job_found_by_a_headless_service() -> None:
    service, job = manifests(OPTIONS["two-nodes"], gpus=4)
    name = job["metadata"]["name"]
    assert service["kind"] == "Service" and service["metadata"]["name"] == name
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    pod = job["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 2
    assert pod["spec"]["subdomain"] == name
    command = pod["spec"]["containers"][0]["command"]
    assert command[:3] == ["python3", "-m", "torch.distributed.run"]
    assert "--nnodes=2" in command and "--nproc-per-node=4" in command
    assert f"--rdzv-endpoint={name}-0.{name}:29500" in command
    assert "--rdzv-conf=join_timeout=120" in command
    assert command[command.index("--no-python") + 1 :] == ["python3", "train.py", "--lr", "3e-4"]
    # Pod hostnames NAME-INDEX stay DNS labels (63 characters) for the last index too.
    (_, big) = manifests(OPTIONS["everything"])
    assert len(f"{big['metadata']['name']}-15") <= 63


def test_mig_profiles_and_pull_secrets() -> None:
    (job,) = manifests(OPTIONS["mig"])
    pod = job["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"] == {"limits": {"nvidia.com/mig-1g.10gb": 2}}
    assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "ngc"}]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (KubernetesOptions(mig="10gb"), "not a MIG profile"),
        (KubernetesOptions(mig="1g.10gb; rm"), "not a MIG profile"),
        (KubernetesOptions(queue="Team Queue"), "--queue"),
        (KubernetesOptions(pull_secrets=("reg_cred",)), "--pull-secret"),
    ],
)
def test_bad_kubernetes_options_are_refused(options: KubernetesOptions, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        manifests(options)


@pytest.mark.parametrize(
    ("image", "enroot", "sif"),
    [
        (
            f"127.0.0.1:5000/itest/demo@{DIGEST}",
            f"127.0.0.1:5000#itest/demo:{DIGEST}",
            f"sha256-{'ab' * 32}.sif",
        ),
        (f"nvcr.io/nvidia/pytorch@{DIGEST}", f"nvcr.io#nvidia/pytorch:{DIGEST}", None),
        (f"nvcr.io/nvidia/pytorch:24.06-py3@{DIGEST}", f"nvcr.io#nvidia/pytorch:{DIGEST}", None),
        (f"localhost/demo@{DIGEST}", f"localhost#demo:{DIGEST}", None),
        (f"team/demo@{DIGEST}", f"registry-1.docker.io#team/demo:{DIGEST}", None),
        (f"docker.io/ubuntu@{DIGEST}", f"registry-1.docker.io#library/ubuntu:{DIGEST}", None),
    ],
)
def test_the_launchers_names_for_the_pushed_image(image: str, enroot: str, sif: str | None) -> None:
    pinned = PinnedImage.parse(image)
    assert pinned.enroot == enroot
    assert pinned.apptainer == f"docker://{pinned.registry}/{pinned.repository}@{DIGEST}"
    if sif:
        assert pinned.sif_name == sif


@pytest.mark.parametrize(
    "uri",
    [
        f"docker://127.0.0.1:5000#itest/demo@{DIGEST}",  # enroot 3.x: Invalid image reference
        f"docker://127.0.0.1:5000/itest/demo:{DIGEST}",  # no REGISTRY#: Docker Hub in 3.x
        f"docker://registry.example.com#Team/Demo:{DIGEST}",  # upper case
        "docker://registry.example.com#team/demo:latest",  # not the digest
    ],
)
def test_uris_enroot_would_misread_are_refused(uri: str) -> None:
    with pytest.raises(UsageError, match="enroot"):
        check_enroot_uri(uri, DIGEST)


@pytest.mark.parametrize("image", ["127.0.0.1:5000/demo:latest", f"demo@{DIGEST[:20]}"])
def test_only_pinned_images_are_launched(image: str) -> None:
    with pytest.raises(UsageError, match="REGISTRY/REPO@sha256"):
        PinnedImage.parse(image)


def test_sacct_rows_keep_ended_jobs_only() -> None:
    text = (
        "7|COMPLETED|00:00:41|2|mn[1-2]|0:0\n"
        "8|FAILED|00:00:26|2|mn[1-2]|1:0\n"
        "9|CANCELLED by 1001|00:00:03|1|vm|0:15\n"
        "10|RUNNING|00:00:01|1|vm|0:0\n"
    )
    rows = parse_sacct(text)
    assert [(r["job"], r["state"], r["exit_code"]) for r in rows] == [
        ("7", "COMPLETED", "0:0"),
        ("8", "FAILED", "1:0"),
        ("9", "CANCELLED by 1001", "0:15"),
    ]


def test_kubernetes_golden() -> None:
    """The two-node, queued export the docs show, as `gpuenv export kubernetes` prints it."""
    from .test_cluster import golden

    documents = manifests(
        KubernetesOptions(queue="team-a", nodes=2, pull_secrets=("regcred",)), gpus=2
    )
    golden("kubernetes-2-nodes.yaml", yaml.safe_dump_all(documents, sort_keys=False))


@pytest.mark.parametrize(
    ("printed", "code", "rows", "reason"),
    [
        ("21|COMPLETED|00:00:41|2|mn[1-2]|0:0\n", 0, [("21", "0:0")], ""),
        ("Slurm accounting storage is disabled\n", 1, None, "keeps no Slurm accounting"),
        ("", 1, None, "sacct failed"),
    ],
)
def test_finished_jobs_from_sacct(
    tmp_path, monkeypatch, printed: str, code: int, rows: list | None, reason: str
) -> None:
    """A stand-in sacct on PATH that records its arguments (the real one answers in
    tests/integration, where the test Slurm keeps no accounting)."""
    from gpuenv.cluster.submit import finished_jobs

    (tmp_path / "out").write_text(printed)
    script = tmp_path / "sacct"
    script.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/args\ncat {tmp_path}/out\nexit {code}\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    finished = finished_jobs("gpuenv-demo")
    assert reason in finished.reason
    if rows is None:
        assert finished.rows is None
    else:
        assert [(r["job"], r["exit_code"]) for r in finished.rows or []] == rows
    assert "--name=gpuenv-demo" in (tmp_path / "args").read_text()


def test_the_jobs_user_has_a_home_and_a_working_folder_it_can_write() -> None:
    """As `gpuenv run` gives (issue 31): the baked project belongs to whoever built it,
    so an init container copies it into the pod's own folder; HOME is an emptyDir."""
    from gpuenv.cluster.manifests import KubernetesOptions, kubernetes_manifests
    from gpuenv.project.spec import default_spec

    (job,) = kubernetes_manifests(
        default_spec("/p", "pytorch"),
        "r/x@sha256:" + "a" * 64,
        ["python", "train.py"],
        {},
        gpus=1,
        shm_size=2**30,
        uid=1234,
        gid=1234,
        platform=None,
        options=KubernetesOptions(None, 1, None, (), 600, None),
        referenced=[],
    )
    pod = job["spec"]["template"]["spec"]
    (main,) = pod["containers"]
    (copy,) = pod["initContainers"]
    assert {"name": "HOME", "value": "/home/gpuenv"} in main["env"]
    mounts = {m["mountPath"]: m["name"] for m in main["volumeMounts"]}
    assert mounts["/workspace"] == "workspace" and mounts["/home/gpuenv"] == "home"
    assert copy["command"] == ["cp", "-R", "/workspace/.", "/work/"]
    assert copy["image"] == main["image"]
    assert pod["securityContext"]["runAsUser"] == 1234 and pod["securityContext"]["fsGroup"] == 1234
    assert {"name": "workspace", "emptyDir": {}} in pod["volumes"]
