"""Real-looking projects, table-driven: what is installed, what is hashed into the lock,
what `gpuenv check` says; and the "Why" list of issue 12 (items 1-3), replayed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuenv.cli.tree import main
from gpuenv.errors import SpecError
from gpuenv.lock.lockfile import requirements_hashes
from gpuenv.project.dependencies import plan_install, read_dependencies
from gpuenv.project.validate import load_spec

REPO = Path(__file__).resolve().parents[2]

PROJECTS = [
    (
        "requirements with includes and a CUDA index",
        {
            "requirements.txt": "--extra-index-url https://download.pytorch.org/whl/cu121\n"
            "torch==2.5.1\ntorchvision==0.20.1\ntorchaudio==2.5.1\n-r reqs/base.txt\n"
            "-c reqs/pins.txt\n",
            "reqs/base.txt": "numpy>=1.26  # arrays\neinops \\\n  ==0.8.0\n",
            "reqs/pins.txt": "numpy<2.3\n",
        },
        "requirements: [requirements.txt]\n",
        ["numpy>=1.26", "einops==0.8.0"],
        {"torch", "torchvision", "torchaudio"},
        {"requirements.txt", "reqs/base.txt", "reqs/pins.txt"},
        "download.pytorch.org/whl/cu121 serves framework builds",
    ),
    (
        "PEP 621 with an optional group",
        {
            "pyproject.toml": '[project]\nname = "p"\ndependencies = ["torch>=2.4", "rich"]\n'
            '[project.optional-dependencies]\ntrain = ["wandb"]\ndocs = ["sphinx"]\n'
        },
        "requirements: [pyproject.toml]\nextras: [train]\n",
        ["rich", "wandb"],
        {"torch"},
        {"pyproject.toml"},
        None,
    ),
    (
        "Poetry caret and tilde",
        {
            "pyproject.toml": '[tool.poetry]\nname = "p"\n[tool.poetry.dependencies]\n'
            'python = "^3.10"\ntorch = "^2.3.0"\nnumpy = "~1.26"\n'
            'tqdm = {version = "*", optional = true}\n'
        },
        "requirements: [pyproject.toml]\n",
        ["numpy<1.27.0,>=1.26"],
        {"torch"},
        {"pyproject.toml"},
        None,
    ),
    (
        "uv project with a lock",
        {
            "pyproject.toml": '[project]\nname = "p"\nversion = "0"\ndependencies = ["torch==2.6.0",'
            ' "six"]\n',
            "uv.lock": 'version = 1\n[[package]]\nname = "p"\nversion = "0"\nsource = { editable'
            ' = "." }\ndependencies = [{ name = "torch" }, { name = "six" }]\n[[package]]\n'
            'name = "six"\nversion = "1.16.0"\nsource = { registry = "https://pypi.org/simple"'
            ' }\n[[package]]\nname = "torch"\nversion = "2.6.0"\nsource = { registry = '
            '"https://pypi.org/simple" }\n',
        },
        "requirements: [pyproject.toml]\n",
        ["six==1.16.0"],
        {"torch"},
        {"pyproject.toml", "uv.lock"},
        None,
    ),
    (
        "conda environment",
        {
            "environment.yml": "dependencies:\n  - python=3.10\n  - pytorch=2.4.0\n"
            "  - cudatoolkit=12.1\n  - pip:\n    - einops\n    - -e .\n"
        },
        "requirements: [environment.yml]\n",
        ["einops"],
        set(),
        {"environment.yml"},
        "conda package cudatoolkit=12.1: not installed",
    ),
    (
        "mixed: requirements, pyproject and a compiled package",
        {
            "requirements.txt": "flash-attn==2.7.4\ntransformers\n",
            "pyproject.toml": '[project]\nname = "p"\ndependencies = ["torch", "datasets"]\n',
        },
        "requirements: [requirements.txt, pyproject.toml]\n",
        ["transformers", "datasets"],
        {"torch"},
        {"requirements.txt", "pyproject.toml"},
        "flash-attn compiles against the image's torch",
    ),
]


def write(root: Path, files: dict[str, str], spec: str = "") -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "gpuenv.yaml").write_text("framework: pytorch\n" + spec)


@pytest.mark.parametrize(
    ("files", "spec", "installed", "left", "hashed", "note"),
    [p[1:] for p in PROJECTS],
    ids=[p[0] for p in PROJECTS],
)
def test_what_is_installed_hashed_and_checked(
    tmp_path: Path,
    files: dict[str, str],
    spec: str,
    installed: list[str],
    left: set[str],
    hashed: set[str],
    note: str | None,
) -> None:
    write(tmp_path, files, spec)
    loaded = load_spec(str(tmp_path))
    plan = plan_install(read_dependencies(loaded), "pytorch", "2.5.0a0+e000cf0ad9")
    assert [d.line() for d in plan.install] == installed
    assert {pin.name for pin in plan.image} == left
    assert set(requirements_hashes(loaded)) == hashed
    if note:
        assert any(note in n for n in plan.notes())
    runner = CliRunner()
    result = runner.invoke(main, ["-C", str(tmp_path), "check"])
    assert "✓ dependencies:" in result.stderr
    if note:
        assert note in result.stderr


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("-r missing.txt\n", "requirements.txt:1: includes 'missing.txt', which does not exist"),
        ("numpy\n-r ../other/requirements.txt\n", "requirements.txt:2: includes '../other/"),
        ("-r /etc/hosts\n", "requirements.txt:1: includes '/etc/hosts', which is outside"),
        ("numpy\ntorch==\n", "requirements.txt:2: 'torch==' is not a valid requirement"),
        # A token in an index URL would be copied into the image and pushed with it.
        (
            "--extra-index-url https://ann:s3cr3tTOKEN@pypi.corp.example/simple\nnumpy\n",
            "requirements.txt:1: --extra-index-url https://***@pypi.corp.example/simple "
            "carries a user name or token",
        ),
    ],
)
def test_why_unfollowable_requirements_are_located_errors(
    tmp_path: Path, text: str, message: str
) -> None:
    write(tmp_path, {"requirements.txt": text}, "requirements: [requirements.txt]\n")
    with pytest.raises(SpecError) as error:
        read_dependencies(load_spec(str(tmp_path)))
    assert message in error.value.message
    result = CliRunner().invoke(main, ["-C", str(tmp_path), "check"])
    assert result.exit_code == 3 and message in result.stderr
    assert "s3cr3tTOKEN" not in result.output


def test_why_a_uv_pin_change_makes_the_lock_stale(tmp_path: Path) -> None:
    project = PROJECTS[3][1]
    write(tmp_path, project, "requirements: [pyproject.toml]\n")
    before = requirements_hashes(load_spec(str(tmp_path)))
    (tmp_path / "uv.lock").write_text(project["uv.lock"].replace("2.6.0", "2.8.0"))
    after = requirements_hashes(load_spec(str(tmp_path)))
    assert before["uv.lock"] != after["uv.lock"]


def test_why_poetry_and_wheel_url_pins_steer_resolution(tmp_path: Path) -> None:
    from gpuenv.app.lock import project_pins

    write(tmp_path, PROJECTS[2][1], "requirements: [pyproject.toml]\n")
    assert [(p.name, p.specifier) for p in project_pins(load_spec(str(tmp_path)))] == [
        ("torch", "<3.0.0,>=2.3.0"),
        ("numpy", "<1.27.0,>=1.26"),
    ]
    url = "torch @ https://download.pytorch.org/whl/cu121/torch-2.3.0%2Bcu121-cp310-cp310-linux_x86_64.whl"
    (tmp_path / "requirements.txt").write_text(url + "\n")
    (tmp_path / "gpuenv.yaml").write_text("framework: pytorch\nrequirements: [requirements.txt]\n")
    # A wheel URL pins the release in its file name (2.3.0+cu121 is a build of 2.3.0).
    assert [(p.name, p.specifier) for p in project_pins(load_spec(str(tmp_path)))] == [
        ("torch", "==2.3.0")
    ]


def test_why_a_torch_pin_picks_an_image_that_ships_it(tmp_path: Path) -> None:
    write(tmp_path, {"requirements.txt": "torch==2.3.1\n"}, "requirements: [requirements.txt]\n")
    result = CliRunner().invoke(
        main, ["-C", str(tmp_path), "lock", "--driver", "580.95.05", "--gpu", "RTX 4090"]
    )
    assert result.exit_code == 0, result.output
    assert "PyTorch 2.3" in result.stderr


def test_why_an_unsatisfiable_pin_names_package_pin_and_images(tmp_path: Path) -> None:
    write(tmp_path, {"requirements.txt": "torch==1.0.0\n"}, "requirements: [requirements.txt]\n")
    result = CliRunner().invoke(
        main, ["-C", str(tmp_path), "lock", "--driver", "580.95.05", "--gpu", "RTX 4090"]
    )
    assert result.exit_code == 4
    assert "no image ships what the project pins: torch==1.0.0 (requirements.txt:1)" in (
        result.stderr
    )
    assert "ships torch 2." in result.stderr


def test_why_framework_none_with_requirements_needs_python(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("numpy\n")
    (tmp_path / "gpuenv.yaml").write_text("framework: none\nrequirements: [requirements.txt]\n")
    runner = CliRunner()
    locked = runner.invoke(
        main, ["-C", str(tmp_path), "lock", "--driver", "580.95.05", "--gpu", "RTX 4090"]
    )
    # lock refuses it as check does (issue 31: one validator), and writes nothing
    assert locked.exit_code == 3, locked.output
    assert "has no Python" in locked.stderr and "choose a framework image" in locked.stderr
    assert not (tmp_path / "gpuenv.lock").exists()


def fake_image(root: Path, dists: dict[str, str], constraint: str) -> dict[str, str]:
    site = root / "site"
    for name, version in dists.items():
        info = site / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (root / "constraint.txt").write_text(constraint)
    return {**os.environ, "PYTHONPATH": str(site), "PIP_CONSTRAINT": str(root / "constraint.txt")}


def test_install_script_leaves_pins_to_the_image_and_explains_a_conflict(tmp_path: Path) -> None:
    """images/ngc/files/install.py, as the image's Python runs it, before pip."""
    env = fake_image(
        tmp_path,
        {"torch": "2.5.0a0+nv", "torchvision": "0.20.0a0+nv", "numpy": "1.26.4"},
        "torch==2.5.0a0+nv\ntorchvision==0.20.0a0+nv\nnumpy==1.26.4\n",
    )
    folder = tmp_path / "requirements"
    folder.mkdir()
    (folder / "image.tsv").write_text("torchvision\t==0.20.1\trequirements.txt:2\t0.20\n")
    (folder / "install.txt").write_text("numpy==2.1.0  # requirements.txt:3\n")
    script = REPO / "images" / "ngc" / "files" / "install.py"
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, str(script), str(folder), "--resolve", str(report)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 3 and not report.exists()
    assert (
        "torchvision==0.20.1 (requirements.txt:2): left to the image (torchvision 0.20.0a0+nv)"
        in (done.stdout)
    )
    conflicts = [line for line in done.stdout.splitlines() if line.startswith("gpuenv: conflict:")]
    assert conflicts == [
        "gpuenv: conflict: numpy==2.1.0 (requirements.txt:3): the image pins numpy==1.26.4 in "
        f"{tmp_path / 'constraint.txt'}; relax the pin or choose another image"
    ]


LINES = st.sampled_from(
    [
        "numpy",
        "torch==2.5.1",
        "torch==",
        "-r other.txt",
        "-c pins.txt",
        "-r ../x.txt",
        "-e .",
        "-e git+https://h/x.git#egg=x",
        "--extra-index-url https://download.pytorch.org/whl/cpu",
        "--hash=sha256:ab",
        "x @ https://h/x-1.0-py3-none-any.whl",
        "flash-attn==2.7",
        "a; python_version < '3'",
        "===weird",
        "torchvision==0.20.1 \\",
        "# c",
        "",
        "--unknown-option",
        "tensorflow[and-cuda]",
        "-f",
        "jax[cpu]",
        "\x00",
        "é",
    ]
)
SOURCES = {
    "requirements.txt": st.lists(LINES, max_size=8).map("\n".join),
    "other.txt": st.lists(LINES, max_size=4).map("\n".join),
    "pyproject.toml": st.sampled_from(
        [
            "",
            "[project",
            '[project]\ndependencies = ["torch>=2", 3, "torch=="]\n',
            '[tool.poetry.dependencies]\ntorch = "^2.3"\nx = {path = "x"}\ny = ["1", "2"]\n',
            '[project]\nname = "p"\n[project.optional-dependencies]\na = "notalist"\n',
            "[tool.uv]\nsources = 3\n",
            '[build-system]\nrequires = "torch"\n',
        ]
    ),
    "uv.lock": st.sampled_from(
        [
            "",
            "version = 1\n",
            '[[package]]\nname = "p"\nsource = { virtual = "." }\n'
            'dependencies = [{ name = "q", marker = "bad marker" }, 3]\n',
            "[[package]\n",
        ]
    ),
    "environment.yml": st.sampled_from(
        [
            "",
            "- a\n",
            "dependencies: 3\n",
            "dependencies:\n  - pytorch=1.0=py_0\n  - pip:\n"
            "    - torch==\n    - -r other.txt\n  - 3\n",
            "dependencies: [\n",
        ]
    ),
}


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_arbitrary_dependency_files_give_a_result_or_a_located_error(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    """Whatever the files say, reading them, detecting and planning never crash: the
    outcome is a plan or a SpecError (exit 3)."""
    from gpuenv.project.dependencies import read_sources
    from gpuenv.project.detect import detect_project

    root = tmp_path_factory.mktemp("p")
    chosen = data.draw(st.lists(st.sampled_from(sorted(SOURCES)), unique=True, min_size=1))
    for name in chosen:
        (root / name).write_text(data.draw(SOURCES[name]), encoding="utf-8")
    sources = tuple(
        n for n in chosen if n in ("requirements.txt", "pyproject.toml", "environment.yml")
    )
    try:
        collected = read_sources(str(root), sources, extras=("a",))
        collected.raise_problems()
        plan_install(collected, "pytorch", "2.5.0a0+x").notes()
    except SpecError as error:
        assert error.exit_code == 3 and error.problems
    try:
        detect_project(str(root))
    except SpecError as error:
        assert error.exit_code == 3


def test_what_an_image_ships_steers_resolution(tmp_path: Path) -> None:
    """A row that records its torchvision is rejected when it cannot satisfy the pin."""
    from dataclasses import replace

    from gpuenv.resolution.pins import Pin, pin_reasons

    write(tmp_path, {}, "")
    from gpuenv.matrix.load import load_matrix

    row = next(r for r in load_matrix().images_for("pytorch") if r.release == "24.10")
    shipping = replace(row, ships=(("torchvision", "0.20.0a0+afc54f7"),))
    assert pin_reasons(shipping, [Pin("torchvision", "==0.20.1", "requirements.txt:2")]) == []
    assert pin_reasons(shipping, [Pin("torchvision", "==0.21.0", "requirements.txt:2")]) == [
        "ships torchvision 0.20.0a0+afc54f7, not torchvision==0.21.0 (requirements.txt:2)"
    ]
    # A package NVIDIA pins in the image's constraint file, where the row records it.
    numpy = replace(row, ships=(("numpy", "1.26.4"),))
    assert pin_reasons(numpy, [Pin("numpy", "==2.1.0", "requirements.txt:3")]) == [
        "ships numpy 1.26.4, not numpy==2.1.0 (requirements.txt:3)"
    ]
    # Unknown stays unknown: not a reason to reject (the build checks it in the image).
    assert pin_reasons(row, [Pin("torchvision", "==0.21.0", "requirements.txt:2")]) == []
    assert pin_reasons(row, [Pin("torch", "==2.5.1", "requirements.txt:1")]) == []


def test_the_matrix_reads_ships(tmp_path: Path) -> None:
    import shutil

    from gpuenv.matrix.load import load_matrix

    folder = tmp_path / "m"
    shutil.copytree(REPO / "matrices", folder)
    path = folder / "ngc-pytorch.yaml"
    text = path.read_text()
    text = text.replace(
        '  - tag: "24.10-py3"\n',
        '  - tag: "24.10-py3"\n    ships: {TorchVision: "0.20.0a0+afc54f7"}\n',
        1,
    )
    path.write_text(text)
    matrix = load_matrix(str(folder))
    row = next(r for r in matrix.images_for("pytorch") if r.tag == "24.10-py3")
    assert row.ships == (("torchvision", "0.20.0a0+afc54f7"),)
    assert (
        row.shipped("torchvision") == "0.20.0a0+afc54f7"
        and row.shipped("torch") == row.framework_version
    )


def test_install_script_holds_companions_and_builds_compiled_packages_late(tmp_path: Path) -> None:
    """With pip replaced by a recorder: what install.py asks pip for, and in which order."""
    env = fake_image(tmp_path, {"torch": "2.5.0a0+nv"}, "torch==2.5.0a0+nv\n")
    folder = tmp_path / "requirements"
    folder.mkdir()
    (folder / "image.tsv").write_text("torchaudio\t\trequirements.txt:2\t2.5\n")
    (folder / "install.txt").write_text("--no-index\nsix  # requirements.txt:1\n")
    (folder / "late.txt").write_text("flash-attn==2.7.4  # requirements.txt:3\n")
    fake_pip = tmp_path / "fakepip" / "pip"
    fake_pip.mkdir(parents=True)
    (fake_pip / "__init__.py").write_text("")
    log = tmp_path / "pip.log"
    # A pip that logs what it is asked and reports one package for each request.
    (fake_pip / "__main__.py").write_text(
        "import json, sys\n"
        f"open({str(log)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
        "report = sys.argv[sys.argv.index('--report') + 1]\n"
        "name = sys.argv[-1].split('=')[0] if '-r' not in sys.argv else 'six'\n"
        "item = {'metadata': {'name': name, 'version': '1.0'}, 'requested': True,\n"
        "        'download_info': {'url': 'https://idx/' + name + '-1.0-py3-none-any.whl',\n"
        "                          'archive_info': {'hashes': {'sha256': 'ab' * 32}}}}\n"
        "json.dump({'install': [item]}, open(report, 'w'))\n"
    )
    env["PYTHONPATH"] = f"{tmp_path / 'fakepip'}:{env['PYTHONPATH']}"
    script = REPO / "images" / "ngc" / "files" / "install.py"
    out = tmp_path / "resolved.json"
    done = subprocess.run(
        [sys.executable, str(script), str(folder), "--resolve", str(out)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    keep = folder / "keep.txt"
    assert keep.read_text() == "torch==2.5.0a0+nv\n"
    chosen = folder / "chosen.txt"
    asked = [
        " ".join(w for w in line.split() if "report-" not in w)
        for line in log.read_text().splitlines()
    ]
    assert asked == [
        f"install --dry-run --quiet --report -c {keep} -r {folder / 'install.txt'}",
        "install --dry-run --quiet --report --no-deps --no-index torchaudio==2.5.*",
        f"install --dry-run --quiet --report --no-build-isolation --no-index -c {keep} "
        f"-c {chosen} flash-attn==2.7.4",
    ]
    report = json.loads(out.read_text())
    assert [(p["name"], p["group"]) for p in report["packages"]] == [
        ("flash-attn", "late"),
        ("six", "install"),
        ("torchaudio", "companion"),
    ]
    assert report["inventory"]["digest"].startswith("sha256:")
    assert report["where"]["six"] == "requirements.txt:1"
