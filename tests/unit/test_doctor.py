"""`gpuenv doctor`'s engine checks against a fake engine: the GPU path (legacy or CDI)
and what is wrong with it, and rootless Docker and Podman explained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuenv.containers.doctor import Check, run_checks
from tests.unit.fake_engine import FakeEngine

PODMAN_VERSION = {
    "Version": "4.3.1",
    "ApiVersion": "1.41",
    "Components": [{"Name": "Podman Engine", "Version": "4.3.1"}],
}


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "host.json"
    gpus = [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-a"}]
    path.write_text(json.dumps({"driver": "550.54.15", "gpus": gpus}))
    monkeypatch.setenv("GPUENV_HOST_FILE", str(path))
    monkeypatch.setenv("GPUENV_STATE_DIR", str(tmp_path / "state"))
    specs = tmp_path / "cdi"
    specs.mkdir()
    monkeypatch.setenv("GPUENV_CDI_SPEC_DIRS", str(specs))
    monkeypatch.delenv("GPUENV_GPU_PATH", raising=False)
    return specs


def checks_of(engine: FakeEngine, directory: Path) -> dict[str, Check]:
    return {check.name: check for check in run_checks(str(directory), lambda: engine)}  # type: ignore[arg-type,return-value]


def write_spec(folder: Path, version: str, names: list[str]) -> None:
    devices = [{"name": n, "containerEdits": {}} for n in names]
    spec = {"cdiVersion": version, "kind": "nvidia.com/gpu", "devices": devices}
    (folder / "nvidia.json").write_text(json.dumps(spec))


def test_rootless_docker_is_explained(host: Path, tmp_path: Path) -> None:
    engine = FakeEngine(
        version_data={"Version": "28.2.2", "ApiVersion": "1.50"},
        info_data={
            "SecurityOptions": ["name=seccomp,profile=builtin", "name=rootless"],
            "CDISpecDirs": [],
        },
    )
    checks = checks_of(engine, tmp_path)
    assert "(rootless)" in checks["Docker engine"].detail
    rootless = checks["rootless"]
    assert rootless.status == "warn"
    assert "no cgroup device control" in rootless.detail
    assert "no-cgroups = true" in rootless.remedy
    assert checks["GPU path"].detail.startswith("legacy: the NVIDIA device request (CDI is off")


def test_docker_with_cdi_names_the_cdi_path(host: Path, tmp_path: Path) -> None:
    write_spec(host, "0.8.0", ["GPU-a", "all"])
    engine = FakeEngine(
        version_data={"Version": "28.2.2", "ApiVersion": "1.50"},
        info_data={"CDISpecDirs": [str(host)]},
    )
    checks = checks_of(engine, tmp_path)
    path = checks["GPU path"]
    assert (path.status, path.detail) == (
        "ok",
        f"cdi: CDI, 2 nvidia.com/gpu device(s) in {host / 'nvidia.json'}",
    )
    assert "NVIDIA runtime" not in checks  # the legacy probe says nothing of CDI
    assert "rootless" not in checks


@pytest.mark.parametrize(
    ("version", "names", "status", "says"),
    [
        ("0.5.0", ["GPU-a"], "ok", "cdi: CDI, 1 nvidia.com/gpu device(s)"),
        ("0.6.0", ["GPU-a"], "fail", "reads CDI specs up to 0.5.0"),
        ("0.5.0", ["GPU-other"], "fail", "names GPU-other, which this host does not have"),
        ("0.5.0", ["GPU-a", "GPU-other"], "warn", "names GPU-other"),
        ("0.5.0", ["0"], "ok", "cdi: CDI, 1"),
    ],
)
def test_podmans_gpu_path(
    host: Path, tmp_path: Path, version: str, names: list[str], status: str, says: str
) -> None:
    write_spec(host, version, names)
    engine = FakeEngine(version_data=PODMAN_VERSION, info_data={})
    checks = checks_of(engine, tmp_path)
    assert checks["Podman"].detail.endswith("Podman 4.3.1 (rootful)")
    path = checks["GPU path"]
    assert path.status == status
    assert says in path.detail + path.remedy


def test_no_spec_on_podman_says_how_to_make_one(host: Path, tmp_path: Path) -> None:
    checks = checks_of(FakeEngine(version_data=PODMAN_VERSION), tmp_path)
    assert checks["GPU path"].status == "fail"
    assert "nvidia-ctk cdi generate" in checks["GPU path"].remedy
