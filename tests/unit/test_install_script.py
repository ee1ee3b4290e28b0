"""images/ngc/files/install.py's own behaviour at build time: what it says when a
requirement cannot be installed, and what it does when the cache mount cannot be written.
(Its pin checks are in test_dependencies.py and test_ngc_pins.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_ngc_pins import INSTALL_SCRIPT, _install_script

INSTALL = _install_script()
WHERE = {"tqdm": "requirements.txt:2", "no-such-package-gpuenv": "requirements.txt:3"}

# The installers' own last lines, as captured from pip 24 and uv 0.13.9 (no terminal).
FAILURES = [
    (
        [
            "ERROR: Could not find a version that satisfies the requirement "
            "no-such-package-gpuenv (from versions: none)",
            "ERROR: No matching distribution found for no-such-package-gpuenv",
        ],
        "no-such-package-gpuenv (requirements.txt:3): No matching distribution found for "
        "no-such-package-gpuenv",
    ),
    (
        [
            "Using Python 3.10.12 environment at: /usr",
            "error: No solution found when resolving dependencies",
            "  cause: Because there is no version of tqdm==99 and you require tqdm==99, we can "
            "conclude that your requirements are unsatisfiable.",
        ],
        "tqdm (requirements.txt:2): Because there is no version of tqdm==99 and you require "
        "tqdm==99, we can conclude that your requirements are unsatisfiable.",
    ),
    # A name inside a longer one is not that requirement.
    (
        ["ERROR: No matching distribution found for tqdm-extras"],
        "No matching distribution found for tqdm-extras",
    ),
    (["Killed"], "Killed"),
    ([], "no output"),
]


@pytest.mark.parametrize(("tail", "said"), FAILURES)
def test_a_failed_install_is_one_line_with_the_requirements_file_and_line(
    tail: list[str], said: str
) -> None:
    assert INSTALL.Installer(None, False, WHERE).explain(tail) == said


CACHE_OURS = INSTALL_SCRIPT.parent / "cache-ours.sh"


def cache_ours(*folders: Path) -> subprocess.CompletedProcess[str]:
    """cache-ours.sh's check, run by sh as the install scripts run it."""
    return subprocess.run(
        ["sh", "-c", f'. "{CACHE_OURS}"; cache_ours "$@"', "sh", *map(str, folders)],
        capture_output=True,
        text=True,
    )


def test_a_cache_of_this_user_alone_is_used(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o755)
    checked = cache_ours(cache, cache / "pip", cache / "uv")
    assert checked.returncode == 0 and checked.stdout == ""
    assert sorted(os.listdir(cache)) == ["pip", "uv"]  # made, and no probe left
    assert not os.listdir(cache / "uv")


def test_a_cache_that_cannot_be_written_is_not_used(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    checked = cache_ours(tmp_path / "file", tmp_path / "file" / "pip")
    assert checked.returncode == 1
    assert checked.stdout.startswith(
        f"gpuenv: warning: not using the dependency cache ({tmp_path / 'file'})"
    )
    assert "cannot be written here" in checked.stdout


@pytest.mark.parametrize(
    ("owner", "mode"),
    [(12345, 0o755), (None, 0o777), (None, 0o775)],
    ids=["another-users", "world-writable", "group-writable"],
)
def test_a_cache_another_user_can_write_is_not_used(
    tmp_path: Path, owner: int | None, mode: int
) -> None:
    """What another user's build (or anyone) could have written never reaches an install."""
    cache = tmp_path / "cache"
    (cache / "uv").mkdir(parents=True)
    cache.chmod(0o755)
    (cache / "uv").chmod(mode)
    if owner is not None:
        if os.getuid() != 0:  # CI runs as root
            pytest.skip("making a folder another user's takes root")
        os.chown(cache / "uv", owner, owner)
    checked = cache_ours(cache, cache / "uv")
    assert checked.returncode == 1
    assert "not using the dependency cache" in checked.stdout
    assert "another user's" in checked.stdout and f"{mode:o}" in checked.stdout


def test_pip_failing_ends_the_step_with_that_line(tmp_path: Path) -> None:
    """The real pip of this Python, with no index: its reason, the requirement's place."""
    folder = tmp_path / "requirements"
    folder.mkdir()
    (folder / "install.txt").write_text(
        "--no-index\nno-such-package-gpuenv  # requirements.txt:3\n"
    )
    done = subprocess.run(
        [sys.executable, str(INSTALL_SCRIPT), str(folder), "--resolve", str(tmp_path / "r.json")],
        capture_output=True,
        text=True,
        env={**os.environ, "PIP_CONSTRAINT": ""},
    )
    assert done.returncode == 1
    last = done.stdout.strip().splitlines()[-1]
    # no set of versions fits: a re-resolve may try with fewer of the locked versions
    assert last.startswith("gpuenv: unresolvable: no-such-package-gpuenv (requirements.txt:3): ")
    assert "no-such-package-gpuenv" in last.split(": ", 2)[2]


def test_a_base_that_is_not_the_locked_one_stops_the_build() -> None:
    """install.py --check-base, the first build step: the base's distributions against
    the count and digest the lock recorded (a re-pushed tag, another image)."""
    wrong = subprocess.run(
        [sys.executable, str(INSTALL_SCRIPT), "--check-base", "3", "sha256:" + "0" * 64],
        capture_output=True,
        text=True,
    )
    assert wrong.returncode == 3
    assert wrong.stdout.startswith("gpuenv: conflict: the base image's Python distributions (")
    assert "run `gpuenv lock`" in wrong.stdout
    count, digest = INSTALL.inventory_digest(INSTALL.installed_distributions())
    same = subprocess.run(
        [sys.executable, str(INSTALL_SCRIPT), "--check-base", str(count), digest],
        capture_output=True,
        text=True,
    )
    assert same.returncode == 0, same.stdout
