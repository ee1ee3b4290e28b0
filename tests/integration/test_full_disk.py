"""A real full disk (issue 12, item 5): a 16 KiB tmpfs that fills up between two locks.
The write fails with exit 8, the path and the fix; the old lock is byte for byte what it
was, no temporary file is left, and the project still checks. Needs root (mount)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import REPO, _missing

pytestmark = pytest.mark.integration

RTX4090 = ["--driver", "550.54.15", "--gpu", "RTX 4090"]


@pytest.fixture
def tiny() -> Iterator[Path]:
    if os.getuid() != 0:
        _missing("mounting a small tmpfs needs root")
    folder = Path(tempfile.mkdtemp(prefix="gpuenv-full-"))
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16k,mode=0755", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode:
        folder.rmdir()
        _missing(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)
        shutil.rmtree(folder, ignore_errors=True)


def gpuenv(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuenv.cli", "-C", str(folder), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )


def test_a_full_disk_never_leaves_half_a_lock(tiny: Path) -> None:
    # No requirements: its lock is whole without an engine (the Python packages, locked
    # in the base image, are another test's).
    (tiny / "gpuenv.yaml").write_text("name: full\nframework: pytorch\nversion: '2.4'\n")
    assert gpuenv(tiny, "lock", *RTX4090).returncode == 0
    before = hashlib.sha256((tiny / "gpuenv.lock").read_bytes()).hexdigest()
    with open(tiny / "fill", "wb", buffering=0) as fill:  # to the last block
        try:
            while fill.write(b"\0" * 1024):
                pass
        except OSError:
            pass
    listing = sorted(os.listdir(tiny))
    result = gpuenv(tiny, "lock", "--upgrade", "--driver", "560.35.03", "--gpu", "RTX 4090")
    assert result.returncode == 8, result.stderr
    assert f"cannot write {tiny / 'gpuenv.lock'}: no space left on device" in result.stderr
    assert f"df -h {tiny}" in result.stderr
    assert "Traceback" not in result.stderr
    assert hashlib.sha256((tiny / "gpuenv.lock").read_bytes()).hexdigest() == before
    assert sorted(os.listdir(tiny)) == listing  # no temporary file left behind
    assert gpuenv(tiny, "lock", "--check").returncode == 0
