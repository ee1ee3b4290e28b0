"""The dependency files of 18 public ML repositories (tests/data/real-projects, copied from
shared/reference/real-projects; each folder's SOURCE.txt names the repository and commit):
what `gpuenv init` detects, what the build installs, leaves to the image and flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuenv.errors import SpecError
from gpuenv.project.dependencies import plan_install, read_sources
from gpuenv.project.detect import detect_project

DATA = Path(__file__).resolve().parents[1] / "data" / "real-projects"

# folder, framework, version constraint, where the framework came from, python,
# packages left to the image, a package installed, a flag that must be shown.
CASES = [
    (
        "CompVis__stable-diffusion",
        "pytorch",
        "1.11",
        "environment.yaml:9",
        "3.8",
        set(),
        "albumentations",
        "conda package cudatoolkit=11.3: not installed",
    ),
    (
        "Lightning-AI__litgpt",
        "pytorch",
        ">=2.7",
        "pyproject.toml:35",
        ">=3.10",
        {"torch"},
        "lightning",
        None,
    ),
    (
        "NVIDIA__Megatron-LM",
        "pytorch",
        ">=2.6.0",
        "pyproject.toml:28",
        "3.12",
        set(),
        "numpy",
        None,
    ),
    ("OpenRLHF__OpenRLHF", "pytorch", None, "requirements.txt:22", None, {"torch"}, "ray", None),
    ("facebookresearch__sam2", "pytorch", ">=2.5.1", "pyproject.toml:4", None, set(), None, None),
    ("google__flax", "jax", ">=0.10.0", "pyproject.toml:16", ">=3.11", {"jax"}, "optax", None),
    (
        "google__flax/examples/gemma",
        "jax",
        "~=0.9",
        "requirements.txt:4",
        None,
        {"jax"},
        "tensorflow-cpu",
        None,
    ),
    (
        "huggingface__diffusers/examples/dreambooth",
        "pytorch",
        None,
        "requirements.txt:1",
        None,
        {"torchvision"},
        "peft",
        None,
    ),
    (
        "huggingface__diffusers/examples/cosmos3",
        "pytorch",
        None,
        "requirements.txt:2",
        None,
        {"torch", "torchvision"},
        "accelerate",
        "https://download.pytorch.org/whl/cu130",
    ),
    (
        "huggingface__transformers/examples/pytorch/speech-recognition",
        "pytorch",
        ">=1.5",
        "requirements.txt:2",
        None,
        {"torch", "torchaudio"},
        "datasets",
        None,
    ),
    ("huggingface__trl", "pytorch", None, "pyproject.toml:32", ">=3.10", set(), "accelerate", None),
    ("karpathy__llm.c", "pytorch", None, "requirements.txt:3", None, {"torch"}, "numpy", None),
    (
        "karpathy__nanochat",
        "pytorch",
        "2.9",
        "pyproject.toml:15",
        "3.10",
        # uv.lock's torch is left to the image, and so is what only torch needs (triton,
        # the nvidia-*-cu12 wheels): never followed, never installed
        {"torch"},
        "tiktoken",
        "https://download.pytorch.org/whl/cu128",
    ),
    (
        # requirements/requirements.txt is DeepSpeed's own list (read since issue 22:
        # a requirements/ folder's shared file), beside its environment.yml
        "microsoft__DeepSpeed",
        "pytorch",
        None,
        "requirements/requirements.txt:10",
        "3.10",
        {"torch"},
        "hjson",
        "conda package pytorch: not installed; the image provides NVIDIA's build",
    ),
    (
        "openai__whisper",
        "pytorch",
        None,
        "pyproject.toml:29",
        ">=3.8",
        {"torch", "triton"},
        "tiktoken",
        None,
    ),
    (
        "tatsu-lab__stanford_alpaca",
        "pytorch",
        None,
        "requirements.txt:6",
        None,
        {"torch"},
        "transformers",
        None,
    ),
    (
        "tensorflow__models/official",
        "tensorflow",
        None,
        "requirements.txt:10",
        None,
        set(),
        "tf-keras",
        None,
    ),
    (
        "ultralytics__ultralytics",
        "pytorch",
        ">=1.8.0",
        "pyproject.toml:73",
        ">=3.8",
        {"torch", "torchvision"},
        "opencv-python",
        None,
    ),
]


@pytest.mark.parametrize(
    ("folder", "framework", "version", "origin", "python", "left", "installed", "flag"),
    CASES,
    ids=[c[0] for c in CASES],
)
def test_real_project(
    folder: str,
    framework: str,
    version: str | None,
    origin: str,
    python: str | None,
    left: set[str],
    installed: str | None,
    flag: str | None,
) -> None:
    root = str(DATA / folder)
    detected = detect_project(root)
    assert (detected.framework, detected.version, detected.python) == (
        framework,
        version,
        python,
    )
    assert detected.framework_from and detected.framework_from.startswith(f"{origin}: ")
    collected = read_sources(root, tuple(detected.requirements))
    plan = plan_install(collected, framework, None)
    assert {pin.name for pin in plan.image} == left
    names = {d.name for d in plan.install}
    assert not names & {"torch", "torchvision", "torchaudio", "jax", "jaxlib", "triton"}
    assert not [name for name in names if name.startswith("nvidia-")]
    if installed:
        assert installed in names
    if flag:
        assert any(flag in note for note in [*detected.also, *plan.notes()])


@pytest.mark.parametrize(
    "folder",
    ["keras-team__keras", "google__flax/examples/mnist", "google__flax/examples/imagenet"],
)
def test_several_backends_ask_for_framework(folder: str) -> None:
    with pytest.raises(SpecError) as error:
        detect_project(str(DATA / folder))
    assert "--framework" in (error.value.hint or "")


def test_a_compiled_package_is_installed_without_build_isolation() -> None:
    root = str(DATA / "OpenRLHF__OpenRLHF")
    plan = plan_install(read_sources(root, ("requirements.txt",)), "pytorch", None)
    assert {d.name for d in plan.no_isolation} == {"deepspeed", "flash-attn"}
    assert any("flash-attn compiles against the image's torch" in n for n in plan.notes())


def test_variant_files_are_not_evidence() -> None:
    detected = detect_project(str(DATA / "huggingface__diffusers/examples/dreambooth"))
    assert detected.framework == "pytorch"
    assert "flax" not in (detected.framework_from or "")
    assert any("not installed: requirements_flax.txt" in a for a in detected.also)


def test_a_uv_lock_is_installed_pinned() -> None:
    root = str(DATA / "karpathy__nanochat")
    collected = read_sources(root, ("pyproject.toml",))
    assert {"pyproject.toml", "uv.lock"} <= set(collected.files)
    pins = {d.name: d.specifier for d in collected.dependencies}
    assert pins["torch"] == "==2.9.1" and pins["tiktoken"].startswith("==")


def test_why_a_build_system_torch_pin_picks_an_image_that_has_it(tmp_path: Path) -> None:
    import shutil

    from click.testing import CliRunner

    from gpuenv.cli.tree import main

    shutil.copytree(DATA / "facebookresearch__sam2", tmp_path / "sam2")
    result = CliRunner().invoke(
        main,
        ["-C", str(tmp_path / "sam2"), "init", "--driver", "580.95.05", "--gpu", "RTX 4090"],
    )
    assert result.exit_code == 0, result.output
    assert "found pyproject.toml:4: torch>=2.5.1" in result.stderr
    assert 'version: ">=2.5.1"' in (tmp_path / "sam2" / "gpuenv.yaml").read_text()


def test_why_an_unpinned_torchaudio_is_held_to_the_image_torch() -> None:
    root = str(DATA / "huggingface__transformers/examples/pytorch/speech-recognition")
    plan = plan_install(read_sources(root, ("requirements.txt",)), "pytorch", "2.5.0a0+e000cf0ad9")
    (audio,) = [pin for pin in plan.image if pin.name == "torchaudio"]
    assert (audio.specifier, audio.hold) == ("", "2.5")
    assert "torchaudio" not in {d.name for d in plan.install}


def test_framework_flag_picks_one_of_several_backends(tmp_path: Path) -> None:
    import shutil

    from click.testing import CliRunner

    from gpuenv.cli.tree import main

    shutil.copytree(DATA / "keras-team__keras", tmp_path / "keras")
    runner = CliRunner()
    host = ["--driver", "580.95.05", "--gpu", "RTX 4090"]
    asked = runner.invoke(main, ["-C", str(tmp_path / "keras"), "init", *host])
    assert asked.exit_code == 3 and "gpuenv init --framework" in asked.stderr
    assert not (tmp_path / "keras" / "gpuenv.yaml").exists()
    chosen = runner.invoke(
        main, ["-C", str(tmp_path / "keras"), "init", "--framework", "jax", *host]
    )
    assert chosen.exit_code == 0, chosen.output
    assert "framework: jax" in (tmp_path / "keras" / "gpuenv.yaml").read_text()
    # The CPU-index torch of its test requirements is reported, not installed.
    assert "whl/cpu serves framework builds for another CUDA: not used" in chosen.stderr
    checked = runner.invoke(main, ["-C", str(tmp_path / "keras"), "check"])
    assert "requirements.txt:10: torch is pytorch, not this image's framework" in checked.stderr
