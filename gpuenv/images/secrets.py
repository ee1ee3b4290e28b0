"""Credentials found by what a file holds, not only by its name: what `--bake` (and so
`gpuenv push`) refuses to put in an image.

The shapes are gitleaks' rules of the same id (github.com/gitleaks/gitleaks,
`config/gitleaks.toml`): a private key's PEM or OpenSSH armour, and tokens whose format
is their issuer's (Hugging Face `hf_`, GitHub `ghp_`…, AWS access key ids, OpenAI, Slack,
PyPI, GitLab). A token without a format of its own (Weights & Biases keys are 40 hex
digits) is found where it is assigned to its variable (`WANDB_API_KEY=…`). A file named
like a credential (`hf_token.txt`, `api-key`, `secret.txt`) whose content is one
high-entropy word is one too.

Only files up to SCAN_LIMIT bytes are read (credentials are small; a checkpoint is not
read twice), and only as text (a file with NUL bytes in its first block is skipped). A
line that says `gpuenv:allow-secret` is not reported: the way to accept a false positive
in the file itself; `--allow-secret PATH` accepts a whole file.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass

SCAN_LIMIT = 1024 * 1024
ALLOW_MARK = b"gpuenv:allow-secret"

_END = rb"(?:[\x60'\"\s;,]|\\[nr]|$)"
# id (gitleaks' rule id where it has one), what it is, the pattern (bytes, per line)
RULES: tuple[tuple[str, str, re.Pattern[bytes]], ...] = tuple(
    (rule, what, re.compile(pattern))
    for rule, what, pattern in (
        (
            "private-key",
            "a private key",
            rb"-----BEGIN[ A-Z0-9_-]{0,100}PRIVATE KEY(?: BLOCK)?-----",
        ),
        ("huggingface-access-token", "a Hugging Face token", rb"\bhf_[a-zA-Z]{34}" + _END),
        (
            "huggingface-organization-api-token",
            "a Hugging Face organization token",
            rb"\bapi_org_[a-zA-Z]{34}" + _END,
        ),
        ("github-pat", "a GitHub personal access token", rb"\bghp_[0-9a-zA-Z]{36}\b"),
        (
            "github-fine-grained-pat",
            "a GitHub fine-grained token",
            rb"\bgithub_pat_[0-9a-zA-Z_]{82}\b",
        ),
        ("github-oauth", "a GitHub OAuth token", rb"\bgho_[0-9a-zA-Z]{36}\b"),
        ("github-app-token", "a GitHub app token", rb"\b(?:ghu|ghs)_[0-9a-zA-Z]{36}\b"),
        (
            "aws-access-token",
            "an AWS access key id",
            rb"\b(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA)[A-Z2-7]{16}\b",
        ),
        (
            "openai-api-key",
            "an OpenAI API key",
            rb"\bsk-(?:proj|svcacct|admin)?-?[A-Za-z0-9_-]{20,74}T3BlbkFJ[A-Za-z0-9_-]{20,74}\b",
        ),
        ("slack-bot-token", "a Slack bot token", rb"\bxoxb-[0-9]{10,13}-[0-9]{10,13}[a-zA-Z0-9-]*"),
        ("pypi-upload-token", "a PyPI upload token", rb"\bpypi-AgEIcHlwaS5vcmc[\w-]{50,1000}"),
        ("gitlab-pat", "a GitLab personal access token", rb"\bglpat-[\w-]{20}\b"),
        (
            "wandb-api-key",
            "a Weights & Biases API key",
            rb"WANDB_API_KEY\s*[=:]\s*['\"]?[0-9a-f]{40}\b",
        ),
    )
)

# A file with one of these in its name holds a credential if it is one high-entropy word.
_CREDENTIAL_NAME = re.compile(r"token|secret|credential|passw|api[-_]?key|auth", re.I)
MIN_SECRET = 20  # characters of a lone word that can be a generated secret
MIN_ENTROPY = 3.5  # bits per character (Shannon); English words and paths stay below


@dataclass(frozen=True)
class SecretFound:
    line: int  # 1-based; 0: the whole file
    rule: str
    what: str


def entropy(word: bytes) -> float:
    """Shannon entropy in bits per byte.

    >>> entropy(b"aaaa"), round(entropy(b"hf_AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGh"), 1)
    (0.0, 4.6)
    """
    counts = Counter(word)
    return sum(n / len(word) * math.log2(len(word) / n) for n in counts.values())


def find_secrets(name: str, data: bytes) -> list[SecretFound]:
    """The credentials in a file's bytes (its base name decides the entropy check).

    >>> find_secrets("x.py", b"key = 'hf_' + 'a'\\n")
    []
    >>> [f.rule for f in find_secrets("deploy_key", b"-----BEGIN OPENSSH PRIVATE KEY-----\\n")]
    ['private-key']
    >>> find_secrets("notes.md", b"AKIAIOSFODNN7EXAMPLE  # gpuenv:allow-secret\\n")
    []
    """
    if b"\0" in data[:8192]:
        return []
    found = []
    for number, line in enumerate(data.splitlines(), start=1):
        if ALLOW_MARK in line:
            continue
        for rule, what, pattern in RULES:
            if pattern.search(line):
                found.append(SecretFound(number, rule, what))
                break
    base = name.rsplit("/", 1)[-1]
    words = data.split()
    if not found and len(words) == 1 and _CREDENTIAL_NAME.search(base) and ALLOW_MARK not in data:
        word = words[0]
        if len(word) >= MIN_SECRET and entropy(word) >= MIN_ENTROPY:
            found.append(SecretFound(1, "generic-secret-file", "a high-entropy secret"))
    return found
