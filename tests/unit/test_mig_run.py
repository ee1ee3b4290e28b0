"""MIG instances on their way out: the device requests (legacy and CDI), `gpuenv top`
and `doctor` (the scripted NVML), and the Kubernetes and Compose exports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gpuenv.cli.tree import main
from gpuenv.cluster.manifests import KubernetesOptions, compose_file, kubernetes_manifests
from gpuenv.cluster.submit import job_gpus
from gpuenv.containers.devices import CdiSpec, EngineFacts, choose_path, device_requests
from gpuenv.errors import UsageError
from gpuenv.reservations.claims import ClaimStore
from gpuenv.reservations.gpus import Grant
from tests.jsonschemas import validate_output
from tests.scripted_nvml import ScriptedNvml, gpu, mig, mig_gpu, mig_uuid, scenario
from tests.unit.fake_engine import lock_packages
from tests.unit.test_cluster import IMAGE, spec
from tests.unit.test_mig import M00, M01, M02, mig_host

PODMAN = EngineFacts("podman", "4.3.1", "1.41")
NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/gpuenv-test.sock"}


def cdi(*names: str) -> CdiSpec:
    return CdiSpec("/etc/cdi/nvidia.yaml", "0.5.0", "nvidia.com/gpu", names, ("/dev/nvidia0",))


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        # nvidia-ctk --device-name-strategy=uuid: MIG devices by their UUID
        ((M00, M01, M02, "GPU-1", "all"), {M01: f"nvidia.com/gpu={M01}"}),
        # --device-name-strategy=index: "<gpu index>:<MIG index>"
        (("0:0", "0:1", "0:2", "1", "all"), {M01: "nvidia.com/gpu=0:1"}),
    ],
)
def test_cdi_names_for_instances(names: tuple[str, ...], expected: dict[str, str]) -> None:
    path = choose_path(PODMAN, [cdi(*names)], mig_host(), exists=lambda _: True)
    assert path.method == "cdi" and path.problems == ()
    assert {k: v for k, v in path.names.items() if k == M01} == expected
    requests = device_requests(path, Grant("devices", (M01,)))
    assert requests == [{"Driver": "cdi", "DeviceIDs": list(expected.values())}]


def test_the_legacy_request_names_the_instance() -> None:
    path = choose_path(EngineFacts("docker", "20.10.24", "1.41"), [], mig_host())
    grant = Grant("devices", (M00, M02))
    assert device_requests(path, grant) == [{"DeviceIDs": [M00, M02], "Capabilities": [["gpu"]]}]
    assert grant.visible_devices == f"{M00},{M02}"


def test_a_spec_naming_this_hosts_instances_is_not_stale() -> None:
    path = choose_path(PODMAN, [cdi(M00, "GPU-1")], mig_host(), exists=lambda _: True)
    assert path.problems == ()


# -- top and doctor --------------------------------------------------------------------


@pytest.fixture
def mig_machine(nvml: ScriptedNvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """GPU 0 in MIG mode (1g.10gb, 1g.10gb, 2g.20gb; utilization unknown), GPU 1 whole;
    one instance claimed by this process. Returns the state folder."""
    machine = mig_gpu(0, "1g.10gb", "1g.10gb", "2g.20gb", utilization=37)
    machine["mig"][2]["processes"] = [{"pid": 999999, "used_memory_mib": 300}]
    nvml.write(scenario(machine, gpu(1)))
    state = str(tmp_path / "state")
    monkeypatch.setenv("GPUENV_STATE_DIR", state)
    for key, value in NO_ENGINE.items():
        monkeypatch.setenv(key, value)
    return state


def test_top_lists_instances_under_their_gpu(mig_machine: str) -> None:
    store = ClaimStore(mig_machine)
    with store.locked():
        store.add([mig_uuid(0, 1)], "trainer")
    result = CliRunner().invoke(main, ["top", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = validate_output("top", result.stdout)
    first, second = report["gpus"]
    # nvml.h: utilization is not supported on a GPU in MIG mode: unknown, never 0
    assert first["utilization"] is None and second["utilization"] == 0
    assert [(m["index"], m["profile"], m["profile_source"]) for m in first["mig"]] == [
        (0, "1g.10gb", "nvml"),
        (1, "1g.10gb", "nvml"),
        (2, "2g.20gb", "nvml"),
    ]
    assert [m["utilization"] for m in first["mig"]] == [None, None, None]  # never 0
    holders = [m["claimed_by"] and m["claimed_by"]["project"] for m in first["mig"]]
    assert holders == [None, "trainer", None]
    assert second["mig"] == []
    (user,) = first["mig"][2]["users"]  # a process NVML lists on that instance
    assert (user["pid"], user["memory_mib"], user["gpuenv"]) == (999999, 300, False)
    assert first["users"] == [] and first["mig"][0]["users"] == []

    table = CliRunner().invoke(main, ["top", "--once"], env={"COLUMNS": "250"})
    assert table.exit_code == 0, table.output
    rows = {line.split()[0]: line for line in table.stdout.splitlines() if line.strip()}
    assert "MIG 1g.10gb" in rows["0:1"] and "n/a" in rows["0:1"] and "trainer" in rows["0:1"]
    assert "free" in rows["0:0"] and "0%" not in rows["0:0"]
    assert "MIG: 1 of 3 instances claimed" in rows["0"]
    assert rows["0"].split("\t")[2] == "-"  # the GPU's utilization: unknown in MIG mode
    assert "outside gpuenv: pid 999999" in rows["0:2"]
    assert "utilization n/a: NVML does not report utilization on GPUs in MIG mode" in " ".join(
        table.stderr.split()
    )
    store.close()


def test_doctor_lists_the_instances(mig_machine: str, nvml: ScriptedNvml) -> None:
    nvml.write(
        scenario(
            gpu(0, mig_mode=1, max_mig_devices=7, mig=[mig(0, 0, "3g.40gb", named=False)]),
            gpu(1, mig_mode=1, max_mig_devices=7, mig=[]),
        )
    )
    result = CliRunner().invoke(main, ["doctor", "--json"], catch_exceptions=False)
    checks = {c["name"]: c for c in json.loads(result.stdout)}
    assert checks["GPU 0 MIG"]["status"] == "ok"
    assert checks["GPU 0 MIG"]["detail"] == (
        f"1 instance: 0:0 3g.40gb (derived from slices and memory), 40192 MiB {mig_uuid(0, 0)}"
    )
    assert checks["GPU 1 MIG"]["status"] == "warn"
    assert "in MIG mode without instances" in checks["GPU 1 MIG"]["detail"]


# -- exports -----------------------------------------------------------------------------

MIG_SPEC = {"mig": "1g.10gb", "count": 2}


def _mig_limits(project: Any, gpus: int, mig: str) -> dict[str, Any]:
    """The resource limits of the Job `gpuenv export kubernetes --mig MIG` writes."""
    (job,) = kubernetes_manifests(
        project,
        IMAGE,
        ["x"],
        {},
        gpus=gpus,
        shm_size=2**30,
        uid=1,
        gid=1,
        options=KubernetesOptions(mig=mig),
    )
    limits: dict[str, Any] = job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    return limits


def test_kubernetes_asks_for_the_specs_profile() -> None:
    project = spec(MIG_SPEC)
    assert job_gpus(project, None) == 2
    (job,) = kubernetes_manifests(
        project, IMAGE, ["python3", "x.py"], {}, gpus=2, shm_size=2**30, uid=1, gid=1
    )
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"] == {"limits": {"nvidia.com/mig-1g.10gb": 2}}
    # --mig still wins over the spec
    assert _mig_limits(project, 1, "3g.40gb") == {"nvidia.com/mig-3g.40gb": 1}


def test_compose_cannot_reserve_a_profile() -> None:
    kwargs = {"shm_size": 2**30, "uid": 1, "gid": 1}
    with pytest.raises(UsageError, match="Compose cannot reserve MIG instances by profile"):
        compose_file(spec(MIG_SPEC), IMAGE, ["x"], {}, gpus=2, device_ids=[], **kwargs)
    named = compose_file(spec(MIG_SPEC), IMAGE, ["x"], {}, gpus=None, device_ids=[M00], **kwargs)
    (service,) = named["services"].values()
    assert service["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == [M00]


def pushed_project(folder: Path, gpus: str) -> None:
    """An initialised, locked project with `gpus` whose image `gpuenv push` recorded."""
    from tests.conftest import reseal

    (folder / "requirements.txt").write_text("numpy\n")
    assert cli(folder, "init", "--driver", "550.54.15", "--gpu", "A100").exit_code == 0
    spec_file = folder / "gpuenv.yaml"
    spec_file.write_text(spec_file.read_text().replace('\ngpus: "all"', f"\ngpus: {gpus}"))
    assert f"gpus: {gpus}" in spec_file.read_text()
    assert cli(folder, "lock", "--driver", "550.54.15", "--gpu", "A100").exit_code == 0
    lock_packages(str(folder))
    lock = folder / "gpuenv.lock"
    lock.write_text(
        lock.read_text() + f"pushed:\n  reference: r/x:1\n  digest: {DIGEST}\n"
        f"  image: r/x@{DIGEST}\n"
    )
    reseal(lock)


DIGEST = "sha256:" + "c" * 64


def cli(folder: Path, *args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(main, ["-C", str(folder), *args], catch_exceptions=False)


def test_the_cli_exports_of_a_mig_spec(tmp_path: Path) -> None:
    """Through the commands: Kubernetes asks for the profile, Compose refuses it, and a
    Slurm job says it asks for whole GPUs."""
    pushed_project(tmp_path, "{mig: 1g.10gb, count: 2}")
    kubernetes = cli(tmp_path, "export", "kubernetes", "job.py")
    assert kubernetes.exit_code == 0, kubernetes.output
    assert "nvidia.com/mig-1g.10gb: 2" in kubernetes.stdout
    compose = cli(tmp_path, "export", "compose", "job.py")
    assert compose.exit_code == 2, compose.output
    assert "Compose cannot reserve MIG instances by profile" in compose.stderr
    slurm = cli(tmp_path, "submit", "--dry-run", "job.py")
    assert slurm.exit_code == 0, slurm.output
    assert "#SBATCH --gres=gpu:2" in slurm.stdout
    assert "asks Slurm for --gres=gpu:2, whole GPUs" in " ".join(slurm.stderr.split())


def test_compose_names_instances_in_the_pushed_image(tmp_path: Path) -> None:
    pushed_project(tmp_path, f"[{M00}, {M01}]")
    compose = cli(tmp_path, "export", "compose", "job.py")
    assert compose.exit_code == 0, compose.output
    import yaml

    (service,) = yaml.safe_load(compose.stdout)["services"].values()
    assert service["image"] == f"r/x@{DIGEST}"
    (device,) = service["deploy"]["resources"]["reservations"]["devices"]
    assert device["device_ids"] == [M00, M01]


def test_kubernetes_refuses_instances_by_uuid() -> None:
    project = spec([M00, M01])
    with pytest.raises(UsageError, match="a Kubernetes Job cannot ask for devices by UUID"):
        kubernetes_manifests(project, IMAGE, ["x"], {}, gpus=2, shm_size=2**30, uid=1, gid=1)
    assert _mig_limits(project, 2, "1g.10gb") == {"nvidia.com/mig-1g.10gb": 2}


def test_top_into_a_pipe_prints_one_snapshot(mig_machine: str) -> None:
    """Output that is not a terminal gets rows (as with --once), never a live view that
    prints nothing and waits for ever (the runner's output is not a terminal)."""
    result = CliRunner().invoke(main, ["top"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    rows = [line.split()[0] for line in result.stdout.splitlines() if line.strip()]
    assert {"0", "0:0", "0:1", "0:2"} <= set(rows), result.stdout


@pytest.mark.parametrize("interval", ["0", "-1", "nan", "inf", "-inf", "NaN"])
def test_top_refuses_an_interval_no_clock_can_wait(interval: str) -> None:
    result = CliRunner().invoke(main, ["top", "--interval", interval])
    assert result.exit_code == 2, result.output
    assert "not a number of seconds above 0" in result.stderr
