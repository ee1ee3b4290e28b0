from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest

from gpuenv.engine.protocol import Builder
from gpuenv.images.context import project_files
from gpuenv.images.render import CACHED, UV_HASHES, Caches, Step, label_value, plan_build
from gpuenv.lock.lockfile import lock_from_resolution
from gpuenv.lock.overlay import Overlay, overlay_from_report
from gpuenv.matrix.load import Matrix
from gpuenv.project.validate import load_spec
from gpuenv.resolution.resolve import resolve

from ..conftest import make_host

DIGEST = "sha256:" + "ab" * 32
MIRROR_REPO = "127.0.0.1:5000/nvidia/pytorch"
INDEX = "https://pypi.example/simple/"
LOCKED = ("numpy", "einops", "rich")


def overlay(*names: str, version: str = "1.0") -> Overlay:
    """An overlay as the resolver reports it: each package at `version`, its sha256 made
    from its name."""
    report = {
        "inventory": {"count": 3, "digest": "sha256:" + "0" * 64},
        "packages": [
            {
                "name": name,
                "version": version,
                "sha256": hashlib.sha256(f"{name}-{version}".encode()).hexdigest(),
                "url": f"https://pypi.example/files/{name}-{version}-py3-none-any.whl",
            }
            for name in names
        ],
    }
    found, refused = overlay_from_report(report, [f"--index-url={INDEX}"], {})
    assert not refused
    return found


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "requirements.txt").write_text("numpy\n-r extra/dev.txt\n")
    (tmp_path / "extra").mkdir()
    (tmp_path / "extra" / "dev.txt").write_text("einops\n")
    (tmp_path / "gpuenv.yaml").write_text(
        "name: demo\nframework: pytorch\nversion: '2.4'\nrequirements: requirements.txt\n"
        "apt: [git, libgl1]\npackages: ['rich>=13', \"x; python_version < '3.13'\"]\n"
    )
    (tmp_path / "train.py").write_text("print('hi')\n")
    return tmp_path


def planned(
    project: Path,
    matrix: Matrix,
    digest: str = DIGEST,
    bake: bool = False,
    repo: str = MIRROR_REPO,
    builder: Builder = "buildkit",
    owner: int = 1000,
    names: tuple[str, ...] = LOCKED,
):
    spec = load_spec(str(project))
    lock = lock_from_resolution(
        resolve(spec, matrix, make_host("550.54.15", "NVIDIA GeForce RTX 4090")),
        matrix.version,
        digest,
    )
    lock = replace(lock, overlay=overlay(*names))
    return plan_build(
        spec,
        lock,
        pull_repository=repo,
        bake=bake,
        lock_digest="sha256:lock",
        builder=builder,
        cache_owner=owner,
    )


def instructions(dockerfile: str) -> list[str]:
    return [
        line.split(" ", 1)[0]
        for line in dockerfile.splitlines()
        if line and not line.startswith((" ", "#"))
    ]


def test_layer_order_and_pinning(project: Path, matrix: Matrix) -> None:
    plan = planned(project, matrix)
    text = plan.dockerfile
    assert f"FROM {MIRROR_REPO}@{DIGEST}\n" in text
    assert f"# Base: nvcr.io/nvidia/pytorch@{DIGEST}\n" in text
    # Its files, apt, the dependency files and their install, in the order users change
    # them; one stage (uv is installed by the install step for itself).
    # the base checked against the lock first, before apt can add Python packages
    assert instructions(text) == ["FROM", "COPY", "RUN", "RUN", "COPY", "RUN", "WORKDIR", "LABEL"]
    assert '"--check-base", "3", "sha256:' in text
    apt, requirements = text.index('apt-install.sh",'), text.index('pip-install.sh"')
    assert apt < requirements
    assert 'COPY ["requirements/", "/tmp/gpuenv/requirements/"]' in text
    assert (
        '"/usr/local/lib/gpuenv/pip-install.sh", "/tmp/gpuenv/requirements", "--cached", "--uv"]'
    ) in text
    # What a build installs is the lock's overlay, as data (overlay.txt), each file by
    # its hash; never the requirement text, a shell or the Dockerfile.
    files = {f.name: f.content().decode() for f in plan.files if f.name.startswith("req")}
    assert [
        line.split(" --hash=")[0] for line in files["requirements/overlay.txt"].splitlines()
    ] == [
        "einops==1.0",
        "numpy==1.0",
        "rich==1.0",
    ]
    assert all(" --hash=sha256:" in line for line in files["requirements/overlay.txt"].splitlines())
    assert files["requirements/options.txt"] == f"--index-url={INDEX}\n"
    assert "x; python_version" not in text


@pytest.mark.parametrize("builder", ["buildkit", "classic"])
def test_exec_form_keeps_values_away_from_a_shell(
    project: Path, matrix: Matrix, builder: Builder
) -> None:
    runs = [
        line
        for line in planned(project, matrix, builder=builder).dockerfile.splitlines()
        if line.startswith("RUN ")
    ]
    assert runs
    for line in runs:
        arguments = json.loads(line[line.index("[") :])  # after the mounts, if any
        assert arguments[0] in ("/bin/sh", "python3")
        assert arguments[1].startswith("/usr/local/lib/gpuenv/")


def test_dependency_downloads_go_to_the_builders_caches_of_the_user(
    project: Path, matrix: Matrix
) -> None:
    """pip's, uv's and apt's downloads are cache mounts named for the user who builds:
    nothing of them lands in a layer, and no user installs from another user's cache."""
    text = planned(project, matrix, owner=1234).dockerfile
    for mount in (
        "--mount=type=cache,id=gpuenv-python-1234,target=/root/.cache,sharing=shared",
        "--mount=type=cache,id=gpuenv-apt-1234,target=/var/cache/apt,sharing=locked",
    ):
        assert mount in text
    # One cache mount a step: buildah 1.28 leaves all but the last locked mount locked.
    for line in text.splitlines():
        assert line.count("--mount=type=cache") <= 1, line
    assert '"apt-install.sh", "--cached", "git", "libgl1"]' in text.replace(
        "/usr/local/lib/gpuenv/", ""
    )
    assert "# syntax=" not in text  # BuildKit's built-in frontend: nothing to fetch
    # The tag is what the image is made of, whoever builds it.
    assert planned(project, matrix, owner=1234).tag == planned(project, matrix, owner=5).tag


def test_the_uv_stage_installs_the_pinned_uv_from_the_projects_index(
    project: Path, matrix: Matrix
) -> None:
    files = {f.name: f.content().decode() for f in planned(project, matrix).files}
    index, uv = files["requirements/uv.txt"].splitlines()
    assert index == f"--index-url={INDEX}"
    # By the sha256 of its wheels: an index serving another file under its name is refused.
    assert uv == f"uv==0.13.9 --hash=sha256:{UV_HASHES[0]} --hash=sha256:{UV_HASHES[1]}"


def test_the_classic_builder_gets_no_mounts_and_pip(project: Path, matrix: Matrix) -> None:
    plan = planned(project, matrix, builder="classic")
    assert "--mount" not in plan.dockerfile and "--uv" not in plan.dockerfile
    assert instructions(plan.dockerfile) == [
        "FROM",
        "COPY",
        "RUN",
        "RUN",
        "COPY",
        "RUN",
        "WORKDIR",
        "LABEL",
    ]
    assert '"/tmp/gpuenv/requirements"]' in plan.dockerfile  # neither --cached nor --uv
    assert "requirements/uv.txt" not in {f.name for f in plan.files}
    assert plan.tag != planned(project, matrix).tag  # another Dockerfile, another image


def test_installer_pip_keeps_the_caches_and_drops_uv(project: Path, matrix: Matrix) -> None:
    spec = project / "gpuenv.yaml"
    spec.write_text(spec.read_text() + "installer: pip\n")
    text = planned(project, matrix).dockerfile
    assert "--uv" not in text and "requirements/uv.txt" not in {
        f.name for f in planned(project, matrix).files
    }
    assert "id=gpuenv-python-1000" in text and '"--cached"]' in text


def test_buildah_gets_the_dockerfile_buildkit_gets(project: Path, matrix: Matrix) -> None:
    assert planned(project, matrix, builder="buildah") == planned(project, matrix)


def test_without_digest_uses_the_tag(project: Path, matrix: Matrix) -> None:
    assert f"FROM {MIRROR_REPO}:24.06-py3\n" in planned(project, matrix, digest="").dockerfile


def test_tag_is_content_addressed(project: Path, matrix: Matrix) -> None:
    plan = planned(project, matrix)
    assert re.fullmatch(r"gpuenv/demo:[0-9a-f]{16}", plan.tag)
    # The mirror does not change the content, so not the tag either.
    assert planned(project, matrix, repo="nvcr.io/nvidia/pytorch").tag == plan.tag
    # Comments in gpuenv.yaml and the GPUs it asks for do not change the image.
    spec = project / "gpuenv.yaml"
    spec.write_text("# note\n" + spec.read_text() + "gpus: 2\n")
    assert planned(project, matrix).tag == plan.tag
    # Nor does the requirement text (one tag is one locked set, on every machine)...
    (project / "extra" / "dev.txt").write_text("einops  # a comment\n")
    assert planned(project, matrix).tag == plan.tag
    # ... but the locked set, the base digest or baking do.
    changed = planned(project, matrix, names=(*LOCKED, "tqdm"))
    assert changed.tag != plan.tag
    assert planned(project, matrix, names=("numpy",)).tag not in (plan.tag, changed.tag)
    assert planned(project, matrix, digest="sha256:" + "cd" * 32).tag != plan.tag
    assert planned(project, matrix, bake=True).tag != plan.tag


def test_code_changes_only_affect_baked_images(project: Path, matrix: Matrix) -> None:
    plain, baked = planned(project, matrix), planned(project, matrix, bake=True)
    (project / "train.py").write_text("print('changed')\n")
    assert planned(project, matrix).tag == plain.tag
    assert planned(project, matrix, bake=True).tag != baked.tag


def test_context_holds_only_what_is_needed(project: Path, matrix: Matrix) -> None:
    (project / "data.bin").write_bytes(b"x" * 1000)
    with tarfile.open(fileobj=io.BytesIO(b"".join(planned(project, matrix).context()))) as archive:
        names = archive.getnames()
    assert sorted(names) == sorted(
        [
            "Dockerfile",
            "gpuenv/apt-install.sh",
            "gpuenv/cache-ours.sh",
            "gpuenv/install.py",
            "gpuenv/pip-install.sh",
            "requirements/uv.txt",
            "requirements/options.txt",
            "requirements/overlay.txt",
            "requirements/overlay-late.txt",
        ]
    )


def test_bake_excludes(project: Path) -> None:
    (project / ".git").mkdir()
    (project / ".git" / "HEAD").write_text("ref")
    (project / "__pycache__").mkdir()
    (project / "__pycache__" / "x.pyc").write_bytes(b"")
    (project / ".env").write_text("SECRET=1")
    (project / "data").mkdir()
    (project / "data" / "big.npy").write_bytes(b"0")
    (project / "notes.md").write_text("x")
    (project / ".dockerignore").write_text("data\n*.md\n")
    names = {f.name for f in project_files(str(project))}
    assert "project/train.py" in names and "project/gpuenv.yaml" in names
    assert not {
        n for n in names if n.startswith(("project/.git", "project/__pycache__", "project/data"))
    }
    assert "project/notes.md" not in names
    assert "project/.env" in names  # kept here: the bake check refuses it (test_bake.py)


def test_symlinks_are_copied_as_links(
    project: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    outside = tmp_path_factory.mktemp("outside") / "secret"
    outside.write_text("do not copy")
    (project / "link").symlink_to(outside)
    files = {f.name: f for f in project_files(str(project))}
    assert files["project/link"].link == str(outside)
    assert files["project/link"].content() == str(outside).encode()


def test_labels(project: Path, matrix: Matrix) -> None:
    plan = planned(project, matrix)
    assert plan.labels["io.gpuenv.project"] == "demo"
    assert plan.labels["io.gpuenv.lock"] == "sha256:lock"
    assert plan.labels["io.gpuenv.base"] == f"nvcr.io/nvidia/pytorch@{DIGEST}"
    assert 'io.gpuenv.project="demo"' in plan.dockerfile
    assert plan.dockerfile.rstrip().endswith('io.gpuenv.version="0.1.0"')


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("plain", '"plain"'),
        ('a "quoted" word', '"a \\"quoted\\" word"'),
        ("$HOME and ${PATH}", '"\\$HOME and \\${PATH}"'),
        ("back\\slash", '"back\\\\slash"'),
        ("two\nlines", '"two lines"'),
    ],
)
def test_label_values_are_escaped(value: str, expected: str) -> None:
    assert label_value(value) == expected


def test_no_package_to_install_is_no_install_step(project: Path, matrix: Matrix) -> None:
    """Everything the requirements ask for is in the image: the overlay is empty, and the
    image is the base with its apt packages."""
    plan = planned(project, matrix, names=())
    assert "pip-install.sh" not in plan.dockerfile
    assert not [f for f in plan.files if f.name.startswith("requirements/")]


def test_an_unresolved_overlay_is_not_built(project: Path, matrix: Matrix) -> None:
    from gpuenv.errors import LockError
    from gpuenv.lock.overlay import UNRESOLVED

    spec = load_spec(str(project))
    lock = lock_from_resolution(
        resolve(spec, matrix, make_host("550.54.15", "NVIDIA GeForce RTX 4090")),
        matrix.version,
        DIGEST,
    )
    assert lock.overlay == UNRESOLVED
    with pytest.raises(LockError, match="has not resolved the Python packages yet"):
        plan_build(spec, lock, pull_repository=MIRROR_REPO)


def test_requirements_files_decide_rebuilds(project: Path, matrix: Matrix) -> None:
    from gpuenv.images.service import build_inputs
    from gpuenv.lock.lockfile import read_lock, write_lock
    from gpuenv.lock.project import Project

    spec = load_spec(str(project))
    lock = lock_from_resolution(
        resolve(spec, matrix, make_host("550.54.15", "NVIDIA GeForce RTX 4090")),
        matrix.version,
        DIGEST,
    )
    write_lock(str(project / "gpuenv.lock"), lock)
    plan = planned(project, matrix)
    inputs = build_inputs(
        Project(spec, read_lock(str(project / "gpuenv.lock")), str(project / "gpuenv.lock")), plan
    )
    assert str(project / "requirements.txt") in inputs
    assert str(project / "extra" / "dev.txt") in inputs
    assert str(project / "gpuenv.yaml") in inputs and str(project / "gpuenv.lock") in inputs


def test_a_file_added_to_a_baked_project_makes_its_build_stamp_stale(
    project: Path,
    matrix: Matrix,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`build --bake` said "✓ up to date" after a file was added: no recorded file changed."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
    from gpuenv.images.service import build_inputs
    from gpuenv.lock.lockfile import read_lock, write_lock
    from gpuenv.lock.project import Project
    from gpuenv.project import stamp

    (project / "src").mkdir()
    (project / "src" / "train.py").write_text("print('hi')\n")
    spec = load_spec(str(project))
    lock = lock_from_resolution(
        resolve(spec, matrix, make_host("550.54.15", "NVIDIA GeForce RTX 4090")),
        matrix.version,
        DIGEST,
    )
    write_lock(str(project / "gpuenv.lock"), lock)
    plan = planned(project, matrix, bake=True)
    inputs = build_inputs(
        Project(spec, read_lock(str(project / "gpuenv.lock")), str(project / "gpuenv.lock")), plan
    )
    assert str(project / "src") in inputs and str(project) in inputs
    stamp.record(str(project), True, "gpuenv/demo:1", inputs)
    assert stamp.fresh_tag(str(project), True) == "gpuenv/demo:1"
    (project / "src" / "new.py").write_text("print('new')\n")
    assert stamp.fresh_tag(str(project), True) is None


APT_STEP = Step("apt.in", (CACHED, "git"), cache="apt")
INSTALL_STEP = Step("requirements.in", ("/tmp/gpuenv/requirements", CACHED, "--uv"), cache="python")


@pytest.mark.parametrize(
    ("step", "owner", "rendered"),
    [
        (
            APT_STEP,
            "1000",
            "RUN --mount=type=cache,id=gpuenv-apt-1000,target=/var/cache/apt,sharing=locked "
            '["/bin/sh", "/usr/local/lib/gpuenv/apt-install.sh", "--cached", "git"]\n',
        ),
        (
            APT_STEP,
            None,
            'RUN ["/bin/sh", "/usr/local/lib/gpuenv/apt-install.sh", "git"]\n',
        ),
        (
            INSTALL_STEP,
            "USER",
            "RUN --mount=type=cache,id=gpuenv-python-USER,target=/root/.cache,sharing=shared "
            '["/bin/sh", "/usr/local/lib/gpuenv/pip-install.sh", "/tmp/gpuenv/requirements", '
            '"--cached", "--uv"]\n',
        ),
        (
            Step("check.in", ("3", "")),  # an empty argument is passed, not dropped
            None,
            'RUN ["python3", "/usr/local/lib/gpuenv/install.py", "--check-base", "3", ""]\n',
        ),
    ],
)
def test_a_step_is_data_rendered_for_the_caches_a_build_has(
    step: Step, owner: str | None, rendered: str
) -> None:
    """The Dockerfile a build runs (the user's caches), the one its tag hashes (neutral
    caches) and the one without cache mounts are one list of steps, rendered three ways."""
    assert step.render(Caches(owner)) == rendered


def test_the_three_dockerfiles_are_the_same_steps(project: Path, matrix: Matrix) -> None:
    plan = planned(project, matrix)
    steps = [line for line in plan.dockerfile.splitlines() if line.startswith(("RUN", "COPY"))]
    hashed = [
        line for line in plan.canonical_dockerfile.splitlines() if line.startswith(("RUN", "COPY"))
    ]
    bare = [line for line in plan.uncached.splitlines() if line.startswith(("RUN", "COPY"))]
    assert len(steps) == len(hashed) == len(bare) > 2
    assert [s.replace("-1000,", "-USER,") for s in steps] == hashed
    assert all("--mount" not in line and "--cached" not in line for line in bare)
