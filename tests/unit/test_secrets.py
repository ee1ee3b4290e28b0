"""Secrets found by content, not only by name (issue 33, item 10): `--bake` (and so
`push`) baked `deploy_key` (an OpenSSH private key) and `hf_token.txt` without a word.
Each credential is made here at run time from its format (never a real one), put in a
real project folder, and the bake check must stop with the file, the line and the fix."""

from __future__ import annotations

import random
import string
from pathlib import Path

import pytest

from gpuenv.errors import BuildError
from gpuenv.images.bake import BakePolicy, check_bake
from gpuenv.images.context import project_files
from gpuenv.images.secrets import SCAN_LIMIT, find_secrets

R = random.Random(33)


def chars(count: int, alphabet: str = string.ascii_letters + string.digits) -> str:
    return "".join(R.choice(alphabet) for _ in range(count))


OPENSSH = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\n" + chars(70) + "\n-----END OPENSSH PRIVATE KEY-----\n"
)
FOUND = {  # file name -> (content, line, rule)
    "deploy_key": (OPENSSH, 1, "private-key"),
    "certs/server.crt.bak": (
        "-----BEGIN RSA PRIVATE KEY-----\n" + chars(64) + "\n",
        1,
        "private-key",
    ),
    "hf_token.txt": ("hf_" + chars(34, string.ascii_letters) + "\n", 1, "huggingface-access-token"),
    "train.py": (
        'import os\n\nos.environ["HF_TOKEN"] = "hf_' + chars(34, string.ascii_letters) + '"\n',
        3,
        "huggingface-access-token",
    ),
    "scripts/ci.sh": ("export GH=ghp_" + chars(36) + "\n", 1, "github-pat"),
    "config.yaml": (
        "aws:\n  key: AKIA" + chars(16, string.ascii_uppercase + "234567") + "\n",
        2,
        "aws-access-token",
    ),
    "settings.env.sh": (
        "WANDB_API_KEY=" + chars(40, "0123456789abcdef") + "\n",
        1,
        "wandb-api-key",
    ),
    "api_key.txt": (
        chars(40, string.ascii_letters + string.digits + "+/") + "\n",
        1,
        "generic-secret-file",
    ),
}
NOT_FOUND = {
    "README.md": "Set HF_TOKEN to your token (hf_...) before training.\n",
    "ca.pem.txt": "-----BEGIN CERTIFICATE-----\n" + chars(64) + "\n",  # public
    "notes.md": "AWS docs use AKIAIOSFODNN7EXAMPLE  <!-- gpuenv:allow-secret -->\n",
    "token_counts.txt": "the quick brown fox jumps\n",  # a credential name, words in it
    "tokenizer.json": '{"vocab": {"hello": 1}}\n',
    "id.txt": "short\n",
}


def project(tmp_path: Path, files: dict[str, str | bytes]) -> Path:
    for name, content in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return tmp_path


@pytest.mark.parametrize("name", list(FOUND))
def test_a_credential_in_a_file_stops_the_bake(tmp_path: Path, name: str) -> None:
    content, line, rule = FOUND[name]
    folder = project(tmp_path, {"main.py": "print(1)\n", name: content})
    with pytest.raises(BuildError) as refused:
        check_bake(project_files(str(folder)), BakePolicy())
    message = refused.value.message
    assert f"  {name}  (line {line}: " in message and f"gitleaks rule {rule}" in message
    assert "gpuenv push" in message and "main.py" not in message
    assert ".dockerignore" in (refused.value.hint or "")
    assert content.strip()[-12:] not in message + (refused.value.hint or "")  # never the secret
    # the ways out: --allow-secret names the file, .dockerignore leaves it out
    check_bake(project_files(str(folder)), BakePolicy(allow_secrets=(name,)))
    (folder / ".dockerignore").write_text(name + "\n")
    check_bake(project_files(str(folder)), BakePolicy())


@pytest.mark.parametrize("name", list(NOT_FOUND))
def test_look_alikes_pass(tmp_path: Path, name: str) -> None:
    folder = project(tmp_path, {name: NOT_FOUND[name]})
    check_bake(project_files(str(folder)), BakePolicy())


def test_large_and_binary_files_are_not_read(tmp_path: Path) -> None:
    """A checkpoint is not read for credentials (nor twice): over SCAN_LIMIT, or binary."""
    folder = project(
        tmp_path,
        {
            "model.bin": b"\0\1" + OPENSSH.encode(),
            "big.txt": OPENSSH + "x" * (SCAN_LIMIT + 1),
        },
    )
    check_bake(project_files(str(folder)), BakePolicy())


def test_every_rule_has_a_finding_and_a_source() -> None:
    from gpuenv.images.secrets import RULES

    made = {rule for content, _, rule in FOUND.values()}
    shapes = {
        "huggingface-organization-api-token": "api_org_" + chars(34, string.ascii_letters),
        "github-fine-grained-pat": "github_pat_" + chars(82),
        "github-oauth": "gho_" + chars(36),
        "github-app-token": "ghs_" + chars(36),
        "openai-api-key": "sk-proj-" + chars(58) + "T3BlbkFJ" + chars(58),
        "slack-bot-token": "xoxb-1234567890-1234567890-" + chars(24),
        "pypi-upload-token": "pypi-AgEIcHlwaS5vcmc" + chars(60),
        "gitlab-pat": "glpat-" + chars(20),
    }
    for rule, shape in shapes.items():
        (found,) = find_secrets("x.py", f"token = '{shape}'\n".encode())
        assert found.rule == rule
        made.add(rule)
    assert made - {"generic-secret-file"} == {rule for rule, _, _ in RULES}
