from __future__ import annotations

from pathlib import Path

import pytest

from gpuenv.errors import SpecError
from gpuenv.project.detect import detect_project, render_spec
from gpuenv.project.spec import GpuRequest
from gpuenv.project.validate import parse_spec_text


@pytest.mark.parametrize(
    ("files", "framework", "version", "python"),
    [
        ({"requirements.txt": "torch==2.3.1\nnumpy\n"}, "pytorch", "2.3", None),
        ({"requirements.txt": "torch==2.3.1+cu121\n"}, "pytorch", "2.3", None),
        ({"requirements.txt": "torch>=2.1,<2.5  # pinned\n"}, "pytorch", "<2.5,>=2.1", None),
        ({"requirements.txt": "torch\n"}, "pytorch", None, None),
        # A variant file is not installed, so it is no evidence either.
        ({"requirements-gpu.txt": "tensorflow==2.15.0\n"}, None, None, None),
        ({"requirements.txt": "tensorflow[and-cuda]==2.17.0\n"}, "tensorflow", "2.17", None),
        ({"requirements.txt": "jax[cuda12]==0.4.30\n"}, "jax", "0.4", None),
        (
            {"requirements.txt": "Torch==2.4.0\n", ".python-version": "3.10.12\n"},
            "pytorch",
            "2.4",
            "3.10",
        ),
        (
            {
                "pyproject.toml": '[project]\nname = "x"\nrequires-python = ">=3.10"\ndependencies = ["torch==2.4.1", "numpy"]\n'
            },
            "pytorch",
            "2.4",
            ">=3.10",
        ),
        (
            {
                "environment.yml": "dependencies:\n  - python=3.10\n  - pytorch=2.1.0\n  - pip:\n    - einops\n"
            },
            "pytorch",
            "2.1",
            "3.10",
        ),
        ({"environment.yml": "dependencies:\n  - pip:\n    - jax==0.4.26\n"}, "jax", "0.4", None),
        ({"README.md": "hello"}, None, None, None),
    ],
)
def test_detection(
    tmp_path: Path,
    files: dict[str, str],
    framework: str | None,
    version: str | None,
    python: str | None,
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    detected = detect_project(str(tmp_path))
    assert (detected.framework, detected.version, detected.python) == (framework, version, python)


def test_several_frameworks_ask_instead_of_guessing(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("tensorflow==2.15\ntorch==2.3.1\n")
    with pytest.raises(SpecError) as error:
        detect_project(str(tmp_path))
    assert "requirements.txt:1: tensorflow==2.15 needs tensorflow" in error.value.message
    assert "requirements.txt:2: torch==2.3.1 needs pytorch" in error.value.message
    assert "gpuenv init --framework" in (error.value.hint or "")


def test_an_unparsable_pyproject_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = \n")
    with pytest.raises(SpecError, match=r"pyproject.toml:2: is not valid TOML"):
        detect_project(str(tmp_path))


@pytest.mark.parametrize("version", [None, "2.3", ">=2.1,<2.5"])
def test_rendered_spec_is_valid_and_means_what_was_chosen(
    tmp_path: Path, version: str | None
) -> None:
    (tmp_path / "requirements.txt").write_text("torch==2.3.1\n")
    detected = detect_project(str(tmp_path))
    text = render_spec(
        str(tmp_path),
        detected,
        framework="pytorch",
        version=version,
        python="3.10",
        cuda=None,
        gpus=GpuRequest("all"),
    )
    spec = parse_spec_text(text, str(tmp_path))
    assert (spec.framework, spec.version, spec.python, spec.cuda) == (
        "pytorch",
        version,
        "3.10",
        None,
    )
    assert spec.requirements == ("requirements.txt",)
    assert spec.shm_size == 8 * 1024**3
    assert "# Detected when this file was written: requirements.txt:1: torch==2.3.1." in text
