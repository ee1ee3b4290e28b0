"""What users pin, replayed as a new user writes it (issue 22, item 1): an exact pin no
image ships is refused, and pytorch.org's CUDA build label is read as the plain pin and
named as what the image replaces. The expected versions are the matrix rows', each with
its source in matrices/ (named per case)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from gpuenv.cli.tree import main

H100 = ["--driver", "560.35.03", "--gpu", "H100"]


def init(project: Path, requirements: str) -> Result:
    (project / "requirements.txt").write_text(requirements)
    return CliRunner().invoke(main, ["-C", str(project), "init", *H100])


@pytest.mark.parametrize(
    ("requirements", "refused", "shipped"),
    [
        # matrices/ngc-jax.yaml 24.10-py3: framework_version 0.4.33 (JAX release notes)
        ("jax[cuda12]==0.4.35\n", "jax==0.4.35 (requirements.txt:1)", "ships jax 0.4.33"),
        # matrices/ngc-jax.yaml 24.04-py3: 0.4.26 (image metadata)
        ("jax==0.4.27\n", "jax==0.4.27 (requirements.txt:1)", "ships jax 0.4.26"),
    ],
)
def test_an_exact_pin_no_image_ships_is_refused(
    tmp_path: Path, requirements: str, refused: str, shipped: str
) -> None:
    result = init(tmp_path, requirements)
    assert result.exit_code == 4, result.output
    said = " ".join(result.stderr.split())
    assert f"no image ships what the project pins: {refused}" in said
    assert shipped in said
    assert not (tmp_path / "gpuenv.lock").exists()


def test_an_exact_pin_an_image_ships_is_taken(tmp_path: Path) -> None:
    result = init(tmp_path, "jax==0.4.33\n")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "nvcr.io/nvidia/jax:24.10-py3"


@pytest.mark.parametrize(
    ("requirements", "image", "said"),
    [
        # matrices/ngc-pytorch.yaml 24.04-py3: PyTorch 2.3.0a0+6ddf5cf85e, the newest 2.3
        (
            "torch==2.3.1+cu121\n",
            "nvcr.io/nvidia/pytorch:24.04-py3",
            "torch==2.3.1+cu121: +cu121 names a build for CUDA 12.1; the image's own build "
            "replaces it (the pin is read as torch==2.3.1)",
        ),
        (
            "torch==2.3.1+cpu\n",
            "nvcr.io/nvidia/pytorch:24.04-py3",
            "+cpu names a CPU-only build",
        ),
    ],
)
def test_a_cuda_build_label_is_read_as_the_plain_pin(
    tmp_path: Path, requirements: str, image: str, said: str
) -> None:
    labelled, plain = tmp_path / "labelled", tmp_path / "plain"
    labelled.mkdir()
    plain.mkdir()
    result = init(labelled, requirements)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == image
    unlabelled = requirements.split("+")[0] + "\n"
    assert init(plain, unlabelled).stdout.strip() == image  # as the plain pin resolves
    checked = CliRunner().invoke(main, ["-C", str(labelled), "check"])
    assert said in " ".join(checked.output.split())


@pytest.mark.parametrize(
    ("requirements", "image", "version"),
    [
        # torchvision-0.16.0 METADATA: Requires-Dist torch (==2.1.0) (matrices/companions.yaml)
        ("torchvision==0.16.0\n", "nvcr.io/nvidia/pytorch:23.10-py3", "PyTorch 2.1"),
        # torchaudio-2.3.1 METADATA: Requires-Dist torch (==2.3.1)
        ("torchaudio==2.3.1\n", "nvcr.io/nvidia/pytorch:24.04-py3", "PyTorch 2.3"),
        # tf_keras-2.15.1 METADATA: Requires-Dist tensorflow <2.16,>=2.15
        ("tf-keras==2.15.1\n", "nvcr.io/nvidia/tensorflow:24.05-tf2-py3", "TensorFlow 2.15"),
        # tf_keras-2.15.0 METADATA names no tensorflow; its maintainers' rule (tf-keras
        # PR #758, #759): tf-keras X.Y follows TensorFlow X.Y. It got TF 2.16.1 before.
        ("tf-keras==2.15.0\n", "nvcr.io/nvidia/tensorflow:24.05-tf2-py3", "TensorFlow 2.15"),
        # Ranges steer as exact pins do (Poetry's ^0.16.0 locked torch 2.14 before)
        ("torchvision>=0.16.0,<0.17.0\n", "nvcr.io/nvidia/pytorch:23.10-py3", "PyTorch 2.1"),
    ],
)
def test_a_companion_pin_steers_to_its_framework_version(
    tmp_path: Path, requirements: str, image: str, version: str
) -> None:
    result = init(tmp_path, requirements)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == image
    assert version in result.stderr


def test_a_companion_release_without_a_framework_version_is_named(tmp_path: Path) -> None:
    """torchaudio-2.11.0's METADATA has no Requires-Dist on torch: unknown, said."""
    result = init(tmp_path, "torchaudio==2.11.0\n")
    assert result.exit_code == 0, result.output
    said = " ".join(result.stderr.split())
    assert (
        "torchaudio==2.11.0 (requirements.txt:1): torchaudio 2.11.0 names no framework "
        "version in its own metadata"
    ) in said


def test_every_companion_row_names_the_wheel_it_was_read_from() -> None:
    from gpuenv.matrix.load import load_matrix

    companions = load_matrix().companions
    assert {c.package for c in companions} == {"torchvision", "torchaudio", "tf-keras"}
    for row in companions:
        by_rule = row.source.startswith("tf-keras maintainers' rule (keras-team/tf-keras PR")
        assert row.source.endswith(".whl METADATA Requires-Dist") or by_rule, row
        assert row.source.replace("_", "-").startswith(row.package.replace("_", "-")), row
        assert not by_rule or row.source.endswith(".whl METADATA names none"), row


@pytest.mark.parametrize(
    ("files", "spec", "first", "second"),
    [
        (
            {"requirements.txt": "torch==2.4.0\n"},
            'version: "2.5"\nrequirements: requirements.txt\n',
            "gpuenv.yaml's version: '2.5'",
            "torch==2.4.0 (requirements.txt:1)",
        ),
        (
            {
                "requirements.txt": "torch==2.3.1\n",
                "pyproject.toml": '[project]\nname = "x"\ndependencies = ["torch>=2.6"]\n',
            },
            "requirements: [requirements.txt, pyproject.toml]\n",
            "torch==2.3.1 (requirements.txt:1)",
            "torch>=2.6 (pyproject.toml:3)",
        ),
    ],
)
def test_two_claims_that_contradict_are_named_against_each_other(
    tmp_path: Path, files: dict[str, str], spec: str, first: str, second: str
) -> None:
    """Never a hint to move one way ("allow PyTorch ≥ 2.6"): both, where each is written."""
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "gpuenv.yaml").write_text(f"name: p\nframework: pytorch\n{spec}")
    result = CliRunner().invoke(main, ["-C", str(tmp_path), "lock", *H100])
    assert result.exit_code == 4, result.output
    said = " ".join(result.stderr.split())
    assert f"{first} and {second} contradict each other: no PyTorch image meets both" in said
    assert "Allow PyTorch" not in said and "allow PyTorch" not in said
    assert not (tmp_path / "gpuenv.lock").exists()
