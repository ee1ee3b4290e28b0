"""The run's preflight verdict, kept in the user cache (run/preflight.py): read back it
is the verdict a fresh judgement gives, for every kind of verdict; anything the verdict
is made from changes the key; a damaged entry is judged again."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from gpuenv.app.init import init_project
from gpuenv.common import cache
from gpuenv.errors import ResolutionError
from gpuenv.host.machine import Gpu, Host
from gpuenv.lock.locked import Locked
from gpuenv.lock.lockfile import read_lock
from gpuenv.matrix.load import load_matrix
from gpuenv.project.overrides import Overrides
from gpuenv.resolution.hostplan import HostPlan
from gpuenv.run import preflight
from gpuenv.run.container import preflight as fresh_preflight
from gpuenv.sharing.gpus import Grant


def _host(driver: str, name: str, count: int = 2) -> Host:
    return Host(driver, tuple(Gpu(i, name, uuid=f"GPU-{i}") for i in range(count)), "test")


@pytest.fixture
def locked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Locked:
    monkeypatch.setenv("GPUENV_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "requirements.txt").write_text("torch==2.3.1\n")
    init_project(str(folder), Overrides(), HostPlan("550.54.15", ("H100 80GB HBM3",)))
    return Locked.from_lock(read_lock(str(folder / "gpuenv.lock")), "sha256:test")


def _fresh(locked: Locked, host: Host, grant: Grant) -> list[str] | ResolutionError:
    try:
        return fresh_preflight(locked, host, grant, load_matrix())
    except ResolutionError as exc:
        return exc


def _judged(locked: Locked, host: Host, grant: Grant) -> list[str] | ResolutionError:
    try:
        return preflight.judge(locked, host, grant)
    except ResolutionError as exc:
        return exc


def _same(a: list[str] | ResolutionError, b: list[str] | ResolutionError) -> bool:
    if isinstance(a, ResolutionError) and isinstance(b, ResolutionError):
        return (a.message, a.explanation, a.hint) == (b.message, b.explanation, b.hint)
    return a == b


HOSTS = [
    ("fits", _host("550.54.15", "NVIDIA H100 80GB HBM3")),
    ("forward compatibility", _host("535.104.05", "NVIDIA H100 80GB HBM3")),
    ("refused: old driver on GeForce", _host("535.104.05", "NVIDIA GeForce RTX 4090")),
    ("refused: cannot drive the GPU", _host("470.57.02", "NVIDIA H100 80GB HBM3")),
]


@pytest.mark.parametrize(("what", "host"), HOSTS, ids=[w for w, _ in HOSTS])
def test_a_verdict_read_back_is_the_fresh_one(
    what: str, host: Host, locked: Locked, monkeypatch: pytest.MonkeyPatch
) -> None:
    grant = Grant("devices", ("GPU-0",))
    fresh = _fresh(locked, host, grant)
    assert _same(_judged(locked, host, grant), fresh)  # judged, and stored
    # Read back: the matrix is not loaded again.
    monkeypatch.setattr("gpuenv.matrix.load.load_matrix", _no_matrix)
    assert _same(_judged(locked, host, grant), fresh)
    assert isinstance(fresh, ResolutionError) == what.startswith("refused")


def _no_matrix(*args: object, **kwargs: object) -> None:
    raise AssertionError("the matrix was loaded although the verdict is in the cache")


def test_the_same_models_on_other_indices_share_a_verdict(locked: Locked) -> None:
    host = _host("550.54.15", "NVIDIA H100 80GB HBM3", count=4)
    one = preflight.verdict_key(locked, host, Grant("devices", ("GPU-0",)))
    other = preflight.verdict_key(locked, host, Grant("devices", ("GPU-3",)))
    assert one is not None and one == other


@pytest.mark.parametrize(
    "change",
    ["driver", "model", "image", "matrix"],
)
def test_what_the_verdict_is_made_from_is_in_its_key(
    change: str, locked: Locked, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = _host("550.54.15", "NVIDIA H100 80GB HBM3")
    grant = Grant("devices", ("GPU-0",))
    before = preflight.verdict_key(locked, host, grant)
    if change == "driver":
        host = _host("555.42.02", "NVIDIA H100 80GB HBM3")
    elif change == "model":
        host = _host("550.54.15", "NVIDIA A100-SXM4-80GB")
    elif change == "image":
        locked = Locked(locked.image + "-other", locked.lock_hash, locked.resolved, locked.requires)
    else:
        from gpuenv.matrix.files import default_matrix_dir

        copy = tmp_path / "matrices"
        shutil.copytree(default_matrix_dir(), copy)
        first = sorted(p for p in copy.iterdir() if p.suffix == ".yaml")[0]
        first.write_text(first.read_text() + "\n# edited\n")
        monkeypatch.setenv("GPUENV_MATRIX_DIR", str(copy))
    assert preflight.verdict_key(locked, host, grant) != before


def test_a_damaged_entry_is_judged_again(locked: Locked, monkeypatch: pytest.MonkeyPatch) -> None:
    host = _host("535.104.05", "NVIDIA GeForce RTX 4090")
    grant = Grant("devices", ("GPU-0",))
    key = preflight.verdict_key(locked, host, grant)
    assert key is not None
    # A stored "fits" for a host that is refused: written as the cache writes, but its
    # body altered afterwards, so its checksum no longer holds.
    assert cache.store(preflight.KIND, key, {"warnings": []})
    folder = Path(os.environ["GPUENV_CACHE_DIR"])
    (entry,) = [p for p in folder.iterdir() if p.name.startswith(preflight.KIND)]
    entry.write_bytes(entry.read_bytes().replace(b"[]", b"[ ]"))
    with pytest.raises(ResolutionError, match="cannot run the locked image"):
        preflight.judge(locked, host, grant)


def test_a_stored_value_of_another_shape_is_a_miss() -> None:
    assert preflight._verdict({"warnings": "fits"}) is None
    assert preflight._verdict({"refused": {"message": 3}}) is None
    assert preflight._verdict(["warnings"]) is None
    assert preflight._verdict({"warnings": ["runs through CUDA forward compatibility"]}) == [
        "runs through CUDA forward compatibility"
    ]


def test_a_mig_instance_is_judged_by_its_gpu(locked: Locked) -> None:
    """Two GPUs of different models, each with an instance: the verdict for one
    instance is not the other's (the key names the instance's GPU model)."""
    from gpuenv.host.machine import MigDevice

    host = Host(
        "550.54.15",
        (
            Gpu(
                0,
                "NVIDIA H100 80GB HBM3",
                uuid="GPU-0",
                mig_mode=True,
                mig_devices=(MigDevice("MIG-a"),),
            ),
            Gpu(
                1,
                "NVIDIA A100-SXM4-80GB",
                uuid="GPU-1",
                mig_mode=True,
                mig_devices=(MigDevice("MIG-b"),),
            ),
        ),
        "test",
    )
    on_h100 = preflight.verdict_key(locked, host, Grant("devices", ("MIG-a",)))
    on_a100 = preflight.verdict_key(locked, host, Grant("devices", ("MIG-b",)))
    assert on_h100 is not None and on_a100 is not None and on_h100 != on_a100
