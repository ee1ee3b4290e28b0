"""Right-sizing, as GPU server guides advise: system memory against GPU memory, the
storage under the engine's data root, and room for the lock's image; thresholds are
settings ([sizing] in the admin's config)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from gpuenv.containers.sizing import (
    SizingSettings,
    disk_finding,
    memory_finding,
    storage_finding,
    storage_kind,
)
from gpuenv.errors import UsageError
from gpuenv.host.machine import Gpu

A100_80 = Gpu(0, "NVIDIA A100-SXM4-80GB", memory_total_mib=81920)


@pytest.mark.parametrize(
    ("system_gib", "gpus", "ratio", "status"),
    [
        (1024, 4, 2.0, "ok"),  # 1 TiB for 320 GiB: 3.2×
        (512, 4, 2.0, "warn"),  # 1.6×
        (512, 4, 1.5, "ok"),  # the admin's own ratio
        (128, 1, 2.0, "warn"),  # 1.6×: a single card in a small box
        (160, 1, 2.0, "ok"),  # exactly 2×
    ],
)
def test_system_memory_against_gpu_memory(
    system_gib: int, gpus: int, ratio: float, status: str
) -> None:
    found = memory_finding(system_gib * 1024, [A100_80] * gpus, SizingSettings(memory_ratio=ratio))
    assert found is not None and found[0] == status
    assert f"{system_gib} GiB of system memory for {80 * gpus} GiB of GPU memory" in found[1]
    if status == "warn":
        assert f"≥ {ratio * 80 * gpus:.0f} GiB here" in found[2]


def test_memory_unknown_is_no_finding() -> None:
    assert memory_finding(None, [A100_80], SizingSettings()) is None
    assert memory_finding(65536, [Gpu(0, "?")], SizingSettings()) is None


def fake_sys(tmp_path: Path, path: str, device: str, rotational: str, partition: bool) -> Path:
    """/sys/dev/block/MAJ:MIN for `path`'s device, as the kernel lays it out."""
    info = os.stat(path)
    disk = tmp_path / "sys" / "devices" / "pci0000:00" / device
    node = disk / f"{device}p1" if partition else disk
    node.mkdir(parents=True)
    if partition:
        (node / "partition").write_text("1\n")
    (disk / "queue").mkdir()
    (disk / "queue" / "rotational").write_text(rotational + "\n")
    links = tmp_path / "sys" / "dev" / "block"
    links.mkdir(parents=True)
    (links / f"{os.major(info.st_dev)}:{os.minor(info.st_dev)}").symlink_to(node)
    return tmp_path / "sys"


@pytest.mark.parametrize(
    ("device", "rotational", "partition", "kind", "status"),
    [
        ("nvme0n1", "0", True, "nvme", "ok"),
        ("sda", "0", True, "ssd", "ok"),
        ("sdb", "1", False, "rotating", "warn"),
        ("md0", "1", False, "rotating", "warn"),
    ],
)
def test_the_storage_under_the_data_root(
    tmp_path: Path, device: str, rotational: str, partition: bool, kind: str, status: str
) -> None:
    root = str(tmp_path)
    if os.major(os.stat(root).st_dev) == 0:
        pytest.skip("tmp_path is not on a block device here (overlay, tmpfs)")
    sys_root = fake_sys(tmp_path, root, device, rotational, partition)
    assert storage_kind(root, str(sys_root)) == (kind, device)
    found = storage_finding(root, (kind, device))
    assert found[0] == status
    if status == "warn":
        assert "SSD or NVMe" in found[2] and "data-root" in found[2]


def test_storage_not_on_a_block_device_is_said_not_guessed(tmp_path: Path) -> None:
    assert storage_kind(str(tmp_path / "missing")) is None
    assert storage_kind("/proc") is None  # major 0: not a block device
    assert storage_finding("/proc", None)[0] == "ok"


def test_room_for_the_locked_image(tmp_path: Path) -> None:
    free = shutil.disk_usage(tmp_path).free / 1e9
    roomy = SizingSettings(free_warn_gb=0, free_fail_gb=0, image_gb=1)
    assert disk_finding(str(tmp_path), 0, roomy)[0] == "ok"
    assert disk_finding(str(tmp_path), 1, roomy)[0] == "ok"
    status, detail, remedy = disk_finding(str(tmp_path), 1, SizingSettings(image_gb=free + 5))
    assert status == "fail" and "the lock's image is not here yet" in detail and "gc" in remedy
    assert (
        disk_finding(str(tmp_path), 0, SizingSettings(free_warn_gb=free + 5, free_fail_gb=0))[0]
        == "warn"
    )
    assert disk_finding(str(tmp_path / "nowhere"), 0, roomy)[0] == "warn"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", SizingSettings()),
        ("[sizing]\nmemory_ratio = 3\nimage_gb = 15\n", SizingSettings(3.0, 15.0, 40.0, 10.0)),
        ("[sizing]\nmemory_ratio = 'lots'\n", "memory_ratio = 'lots' is not a number"),
        (
            "[sizing]\nfree_gb = 1\n",
            "takes memory_ratio, image_gb, free_warn_gb, free_fail_gb only",
        ),
    ],
)
def test_sizing_settings(tmp_path: Path, text: str, expected: SizingSettings | str) -> None:
    config = tmp_path / "config.toml"
    config.write_text(text)
    config.chmod(0o644)
    env = {"GPUENV_SYSTEM_CONFIG": str(config)}
    if isinstance(expected, str):
        with pytest.raises(UsageError, match=expected):
            SizingSettings.load(env)
    else:
        assert SizingSettings.load(env) == expected
