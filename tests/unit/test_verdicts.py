"""Verdicts that mean what they say (issue 31, item 3): each option and each answer does
what its name and the docs say, tried as a new user tries them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from gpuenv.cli import main


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
