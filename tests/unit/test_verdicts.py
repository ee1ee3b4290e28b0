"""Verdicts that mean what they say (issue 31, item 3): each option and each answer does
what its name and the docs say, tried as a new user tries them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from gpuenv.cli.tree import main


def invoke(project: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["-C", str(project), *args])


def said(result: Result) -> str:
    return " ".join(result.stderr.split())


H100_580 = ["--driver", "580.65.06", "--gpu", "H100"]


def test_strict_driver_takes_native_only_never_forward_compatibility(tmp_path: Path) -> None:
    """An H100 on 580.65.06 runs 26.05 (CUDA 13.2) by forward compatibility; with
    --strict-driver only an image whose toolkit's own driver is ≤ 580.65.06 fits."""
    loose = invoke(tmp_path, "resolve", "--framework", "pytorch", *H100_580, "--json")
    assert loose.exit_code == 0, loose.output
    assert json.loads(loose.stdout)["compatibility_mode"] != "native"
    strict = invoke(
        tmp_path, "resolve", "--framework", "pytorch", *H100_580, "--strict-driver", "--json"
    )
    assert strict.exit_code == 0, strict.output
    data = json.loads(strict.stdout)
    assert data["compatibility_mode"] == "native", data
    explained = invoke(
        tmp_path, "resolve", "--framework", "pytorch", *H100_580, "--strict-driver", "--explain"
    )
    rows = {line.split("\t")[1]: line for line in explained.output.splitlines() if "\t" in line}
    assert rows["26.05-py3"].startswith("✗")
    assert "CUDA 13.2.1's own driver, which strict_driver requires" in rows["26.05-py3"]


@pytest.mark.parametrize(
    ("flags", "first_closest"),
    [
        (
            ("--version", "1.4.0"),
            "PyTorch 22.02 (nvcr.io/nvidia/pytorch:22.02-py3) has PyTorch 1.11",
        ),
        (("--python", "3.6"), "PyTorch 23.04 (nvcr.io/nvidia/pytorch:23.04-py3) has Python 3.8"),
    ],
)
def test_closest_means_nearest_by_version_not_newest(
    tmp_path: Path, flags: tuple[str, ...], first_closest: str
) -> None:
    result = invoke(
        tmp_path,
        "resolve",
        "--framework",
        "pytorch",
        *flags,
        "--driver",
        "550.54.15",
        "--gpu",
        "A100",
    )
    assert result.exit_code == 4, result.output
    lines = [line.strip() for line in result.stderr.splitlines()]
    after = lines[lines.index(next(x for x in lines if x.endswith("the closest:"))) + 1 :]
    assert after[0].startswith(first_closest), result.stderr
    assert "26." not in " ".join(after[:3])  # never the newest images for an old version


POETRY = """[tool.poetry]
name = "p"
version = "0.1.0"

[tool.poetry.dependencies]
python = "^3.10"
torch = "^2.1.0"
torchvision = "^0.16.0"
"""


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("pyproject.toml", POETRY),
        ("requirements.txt", "torch>=2.1\ntorchvision~=0.16.0\n"),
        ("environment.yml", "dependencies:\n  - pytorch>=2.1\n  - torchvision=0.16\n"),
    ],
)
def test_a_companion_range_steers_as_an_exact_pin_in_every_layout(
    tmp_path: Path, name: str, text: str
) -> None:
    """torchvision 0.16.x requires torch 2.1.x (its own metadata): the lock takes a
    PyTorch 2.1 image, never the newest (torch 2.14), and `check` agrees."""
    (tmp_path / name).write_text(text)
    result = invoke(tmp_path, "init", "--driver", "550.54.15", "--gpu", "A100")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "nvcr.io/nvidia/pytorch:23.10-py3"
    assert invoke(tmp_path, "check").exit_code == 0


# (a layout gpuenv does not read, its text, the line of the pin, the fix named)
UNREAD = [
    ("Pipfile", '[packages]\nrequests = "*"\ntorch = "==2.1.2"\n', 3, "pipenv requirements"),
    ("Pipfile", '[packages]\ntorch = {version = "==2.1.2", index = "pytorch"}\n', 2, "pipenv"),
    (
        "setup.cfg",
        "[metadata]\nname = p\n[options]\ninstall_requires =\n    numpy\n    torch==2.1.2\n",
        6,
        "move [options] install_requires",
    ),
    (
        "pixi.toml",
        '[project]\nname = "p"\n[dependencies]\npytorch = "2.1.*"\n',
        4,
        "pixi project export",
    ),
    ("pixi.toml", '[pypi-dependencies]\ntorch = "==2.1.2"\n', 2, "pixi project export"),
]


@pytest.mark.parametrize(("name", "text", "line", "fix"), UNREAD)
def test_a_framework_pinned_only_in_an_unread_layout_is_refused_with_the_fix(
    tmp_path: Path, name: str, text: str, line: int, fix: str
) -> None:
    """A Pipfile-only project with torch==2.1.2 was warned about, then locked on torch
    2.14 with exit 0. Now exit 3, the pin located, and how to write it where gpuenv reads
    it; nothing written. --version decides, and then init goes on."""
    (tmp_path / name).write_text(text)
    result = invoke(tmp_path, "init", "--driver", "550.54.15", "--gpu", "A100")
    assert result.exit_code == 3, result.output
    assert f"{name}:{line}: torch" in result.stderr and f"gpuenv does not read {name}" in said(
        result
    )
    assert fix in said(result) and "--framework pytorch --version 2.1" in said(result)
    assert not (tmp_path / "gpuenv.yaml").exists() and not (tmp_path / "gpuenv.lock").exists()
    chosen = invoke(
        tmp_path, "init", "--framework", "pytorch", "--version", "2.1", "--driver", "550.54.15"
    )
    assert chosen.exit_code == 0, chosen.output
    assert chosen.stdout.strip() == "nvcr.io/nvidia/pytorch:23.10-py3"
    assert f"{name}: not read" in said(chosen) or f"{name}: its [options]" in said(chosen)


def test_lock_refuses_what_check_refuses(tmp_path: Path) -> None:
    """`framework: none` (a plain CUDA image, no Python) with requirements: `lock` wrote
    the lock, then `check` rejected it. One validator: `lock` refuses it too, and writes
    nothing."""
    (tmp_path / "requirements.txt").write_text("numpy\n")
    (tmp_path / "gpuenv.yaml").write_text("name: n\nframework: none\n")
    assert invoke(tmp_path, "lock", "--driver", "550.54.15").exit_code == 0
    lock = (tmp_path / "gpuenv.lock").read_text()
    (tmp_path / "gpuenv.yaml").write_text(
        "name: n\nframework: none\nrequirements: [requirements.txt]\n"
    )
    checked = invoke(tmp_path, "check")
    locked = invoke(tmp_path, "lock", "--driver", "550.54.15")
    assert locked.exit_code == checked.exit_code == 3, locked.output + checked.output
    why = "field 'framework': is none, and"
    assert why in said(locked) and why in said(checked)
    assert (tmp_path / "gpuenv.lock").read_text() == lock  # not rewritten


# (gpus: in gpuenv.yaml, exit code, what is said) on a described one-A100 host
GPU_REQUESTS = [
    ("[3]", 0, "gpuenv.yaml's gpus names GPU 3, which this host does not have (GPU 0;"),
    ("5", 0, "gpuenv.yaml asks for 5 GPUs; this host has 1"),
    ("99999999999999999999999", 3, "a count is at most 4096 (no host has more)"),
    ("[99999]", 3, "is not a GPU index (0 to 4095)"),
    ("{mig: 1g.10gb, count: 100000}", 3, "is not a count of at least 1"),
]


@pytest.mark.parametrize(("gpus", "code", "message"), GPU_REQUESTS)
def test_a_gpu_request_the_host_cannot_meet_is_said(
    tmp_path: Path, gpus: str, code: int, message: str
) -> None:
    (tmp_path / "gpuenv.yaml").write_text(f"name: g\nframework: pytorch\ngpus: {gpus}\n")
    result = invoke(tmp_path, "resolve", "--driver", "550.54.15", "--gpu", "A100")
    assert result.exit_code == code, result.output
    assert message in said(result)


def test_a_driver_newer_than_any_known_is_said(tmp_path: Path) -> None:
    result = invoke(tmp_path, "resolve", "--framework", "pytorch", "--driver", "9999.1")
    assert result.exit_code == 0, result.output
    assert "driver 9999.1 is far newer than any driver the matrix knows" in said(result)
    sane = invoke(tmp_path, "resolve", "--framework", "pytorch", "--driver", "580.65.06")
    assert "far newer" not in sane.stderr
