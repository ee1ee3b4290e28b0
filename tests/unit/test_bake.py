"""What --bake copies (Docker's .dockerignore rules on a real folder) and what it refuses:
credential-looking files, projects over the size limit (gpuenv.images.bake)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuenv.errors import BuildError
from gpuenv.images import bake
from gpuenv.images.bake import BakePolicy, check_bake, summarize
from gpuenv.images.context import ContextFile, project_files

TREE = [
    "train.py",
    "notes.md",
    "docs/guide.md",
    "docs/README.md",
    "data/train/a.npy",
    "data/keep.txt",
    "src/pkg/mod.py",
    "src/pkg/__pycache__/mod.cpython-311.pyc",
    "src/pkg/test_mod.py",
    ".git/HEAD",
    ".venv/bin/python",
    "gpuenv.lock",
    ".gpuenv/slurm/job.sbatch",
]


@pytest.mark.parametrize(
    ("ignore", "kept", "left_out"),
    [
        ("", ["train.py", "notes.md", "docs/guide.md", "data/keep.txt"], [".git/HEAD"]),
        # anchored at the root, unlike .gitignore
        ("*.md\n", ["docs/guide.md", "docs/README.md"], ["notes.md"]),
        ("**/*.md\n", ["train.py"], ["notes.md", "docs/guide.md", "docs/README.md"]),
        # a folder excludes everything below it; a later ! brings one file back
        ("docs\n!docs/README.md\n", ["docs/README.md"], ["docs/guide.md"]),
        ("data\n!data/keep.txt\n", ["data/keep.txt"], ["data/train/a.npy"]),
        # the last matching line wins
        ("*.md\n!notes.md\nnotes.md\n", [], ["notes.md"]),
        ("src/**/test_*.py\n", ["src/pkg/mod.py"], ["src/pkg/test_mod.py"]),
        ("/train.py\n", ["notes.md"], ["train.py"]),
        # ** re-includes through an excluded folder; wildcard ! patterns are honoured
        ("**\n!**/*.py\n", ["train.py", "src/pkg/mod.py"], ["notes.md", "data/keep.txt"]),
        # gpuenv's defaults can be re-included; its own files never
        (
            "!.git\n!gpuenv.lock\n!.gpuenv\n",
            [".git/HEAD"],
            ["gpuenv.lock", ".gpuenv/slurm/job.sbatch"],
        ),
        ("# a comment\n  \n", ["train.py"], ["src/pkg/__pycache__/mod.cpython-311.pyc"]),
    ],
)
def test_dockerignore_on_a_project(
    tmp_path: Path, ignore: str, kept: list[str], left_out: list[str]
) -> None:
    for name in TREE:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    if ignore:
        (tmp_path / ".dockerignore").write_text(ignore)
    names = {f.name.removeprefix("project/") for f in project_files(str(tmp_path))}
    assert set(kept) <= names
    assert not set(left_out) & names


def test_a_bad_pattern_is_a_build_error(tmp_path: Path) -> None:
    (tmp_path / ".dockerignore").write_text("[a-\n")
    with pytest.raises(BuildError, match=r"\.dockerignore"):
        project_files(str(tmp_path))


@pytest.mark.parametrize(
    ("path", "credential"),
    [
        (".aws/credentials", True),
        ("deploy/.ssh/id_rsa", True),
        (".ssh/config", True),
        (".kube/config", True),
        ("ops/kubeconfig", True),
        (".docker/config.json", True),
        (".docker/daemon.json", False),
        ("certs/server.pem", True),
        ("certs/server.key", True),
        ("keys/id_ed25519", True),
        ("keys/id_ed25519.pub", False),
        ("keys/id_rsa_old", True),
        (".git-credentials", True),
        (".pypirc", True),
        (".netrc", True),
        (".npmrc", True),
        (".env", True),
        ("app/.env.production", True),
        (".env.example", False),
        (".config/gcloud/application_default_credentials.json", True),
        ("credentials.json", True),
        ("store.jks", True),
        ("train.py", False),
        ("data/keys.csv", False),
        ("monkey.py", False),
    ],
)
def test_credential_names(path: str, credential: bool) -> None:
    files = [ContextFile(f"project/{path}", data=b"x", size=1)]
    if credential:
        with pytest.raises(BuildError, match="credential-looking") as raised:
            check_bake(files, BakePolicy())
        assert path in str(raised.value) and ".dockerignore" in (raised.value.hint or "")
        assert raised.value.exit_code == 12
        check_bake(files, BakePolicy(allow_secrets=(path,)))
    else:
        check_bake(files, BakePolicy())


def test_allow_secret_takes_patterns(tmp_path: Path) -> None:
    files = [
        ContextFile("project/certs/a.pem", data=b"", size=0),
        ContextFile("project/certs/b.pem", data=b"", size=0),
        ContextFile("project/.aws/credentials", data=b"", size=0),
    ]
    check_bake(files, BakePolicy(allow_secrets=("certs/*.pem", ".aws")))
    with pytest.raises(BuildError, match=r"1 credential-looking file\b"):
        check_bake(files, BakePolicy(allow_secrets=("certs",)))
    with pytest.raises(BuildError, match="--allow-secret"):
        check_bake(files, BakePolicy(allow_secrets=("[",)))


def test_credentials_excluded_in_dockerignore_pass(tmp_path: Path) -> None:
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text("[default]\n")
    (tmp_path / "train.py").write_text("print(1)\n")
    with pytest.raises(BuildError):
        check_bake(project_files(str(tmp_path)), BakePolicy())
    (tmp_path / ".dockerignore").write_text(".aws\n")
    summary = check_bake(project_files(str(tmp_path)), BakePolicy())
    assert summary.count == 2 and summary.total == len("print(1)\n") + len(".aws\n")


def test_size_limit_and_report(monkeypatch: pytest.MonkeyPatch) -> None:
    files = [
        ContextFile("project/data/a.bin", data=b"", size=700),
        ContextFile("project/data/b.bin", data=b"", size=400),
        ContextFile("project/ckpt/last.pt", data=b"", size=300),
        ContextFile("project/train.py", data=b"", size=10),
        ContextFile("gpuenv/entrypoint", data=b"", size=10**9),  # gpuenv's own: not counted
    ]
    summary = summarize([f for f in files if f.name.startswith("project/")])
    assert summary.largest[:2] == (("data/", 1100), ("ckpt/", 300))
    assert "1.4 KiB of project (4 files); largest: data/ 1.1 KiB" in summary.describe()
    monkeypatch.setattr(bake, "BAKE_LIMIT", 1000)
    with pytest.raises(BuildError, match=r"more than 1000 B: data/ 1\.1 KiB") as raised:
        check_bake(files, BakePolicy())
    assert "--allow-large" in (raised.value.hint or "")
    assert check_bake(files, BakePolicy(allow_large=True)).total == 1410
