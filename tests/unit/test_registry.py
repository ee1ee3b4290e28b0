from __future__ import annotations

from pathlib import Path

import pytest

from gpuenv.engine.failures import pull_error, redact
from gpuenv.images.registry import (
    InvalidMirror,
    credentials,
    parse_reference,
    pull_repository,
    registry_mirror,
)


@pytest.mark.parametrize(
    ("text", "repository", "tag", "digest", "registry"),
    [
        (
            "nvcr.io/nvidia/pytorch:24.05-py3",
            "nvcr.io/nvidia/pytorch",
            "24.05-py3",
            None,
            "nvcr.io",
        ),
        (
            "127.0.0.1:5000/nvidia/pytorch:24.05-py3",
            "127.0.0.1:5000/nvidia/pytorch",
            "24.05-py3",
            None,
            "127.0.0.1:5000",
        ),
        (
            "localhost:5000/x@sha256:" + "a" * 64,
            "localhost:5000/x",
            None,
            "sha256:" + "a" * 64,
            "localhost:5000",
        ),
        ("ubuntu:22.04", "ubuntu", "22.04", None, "docker.io"),
        ("library/ubuntu", "library/ubuntu", None, None, "docker.io"),
    ],
)
def test_parse_reference(
    text: str, repository: str, tag: str | None, digest: str | None, registry: str
) -> None:
    reference = parse_reference(text)
    assert (reference.repository, reference.tag, reference.digest, reference.registry) == (
        repository,
        tag,
        digest,
        registry,
    )
    assert str(reference) == text


def test_mirror_rewrites_only_nvcr() -> None:
    assert (
        pull_repository("nvcr.io/nvidia/pytorch", "mirror.local:5000")
        == "mirror.local:5000/nvidia/pytorch"
    )
    assert pull_repository("ghcr.io/nvidia/jax", "mirror.local:5000") == "ghcr.io/nvidia/jax"


def test_mirror_from_env_and_config(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("registry_mirror: mirror.example:5000\n")
    assert registry_mirror({"GPUENV_CONFIG": str(config)}) == ("mirror.example:5000", str(config))
    env = {"GPUENV_CONFIG": str(config), "GPUENV_REGISTRY_MIRROR": "http://127.0.0.1:5000/"}
    assert registry_mirror(env) == ("127.0.0.1:5000", "GPUENV_REGISTRY_MIRROR")
    assert registry_mirror({"GPUENV_CONFIG": str(tmp_path / "none.yaml")}) == (None, "")
    with pytest.raises(InvalidMirror, match="is not a registry mirror"):
        registry_mirror({"GPUENV_REGISTRY_MIRROR": "a b/c"})
    config.write_text("registry_mirror: [1]\n")
    with pytest.raises(InvalidMirror, match="must be text"):
        registry_mirror({"GPUENV_CONFIG": str(config)})


def test_ngc_key_only_for_nvcr() -> None:
    env = {"NGC_API_KEY": "k-123456"}
    assert credentials("nvcr.io/nvidia/pytorch", env) == {
        "username": "$oauthtoken",
        "password": "k-123456",
        "serveraddress": "nvcr.io",
    }
    assert credentials("127.0.0.1:5000/nvidia/pytorch", env) is None
    assert credentials("nvcr.io/nvidia/pytorch", {}) is None
    assert redact("Get https://x?token=k-123456", env) == "Get https://x?token=***"


MISSING = "manifest for x:1 not found: manifest unknown"
DIGEST = "sha256:" + "a" * 64


@pytest.mark.parametrize(
    ("reference", "explanation", "status", "verb", "fragment", "hint"),
    [
        # A hint names the fix for that case, and only that case.
        ("nvcr.io/nvidia/pytorch:1", MISSING, 404, "pull", "does not exist", "`gpuenv matrix`"),
        (
            f"nvcr.io/nvidia/pytorch@{DIGEST}",
            MISSING,
            404,
            "pull",
            "does not exist",
            "lock --upgrade",
        ),
        (
            "127.0.0.1:5000/nvidia/pytorch:1",
            MISSING,
            404,
            "pull",
            "does not exist",
            "copy the image there",
        ),
        ("ghcr.io/team/train:1", MISSING, 404, "pull", "does not exist", "`base:` in gpuenv.yaml"),
        ("127.0.0.1:5000/team/x:1", MISSING, 404, "push", "does not exist", "push to a repository"),
        (
            "nvcr.io/nvidia/pytorch:1",
            "unauthorized: authentication required",
            401,
            "pull",
            "refused the pull",
            "NGC_API_KEY",
        ),
        (
            "team/train:1",
            "pull access denied for team/train, repository does not exist or may require 'docker login'",
            403,
            "pull",
            "was not found",
            "docker login docker.io",
        ),
        (
            "nvcr.io/nvidia/pytorch:1",
            'Head "https://nvcr.io/v2/": dial tcp: i/o timeout',
            500,
            "pull",
            "cannot reach",
            "GPUENV_REGISTRY_MIRROR=host:port",
        ),
        (
            "registry.example.com/team/x:1",
            "dial tcp 10.0.0.1:443: connect: connection refused",
            500,
            "pull",
            "cannot reach",
            "start registry.example.com",
        ),
        (
            "registry.example.com/team/x:1",
            "tls: failed to verify certificate: x509: certificate signed by unknown authority",
            500,
            "pull",
            "does not trust",
            "certs.d/registry.example.com/ca.crt",
        ),
        ("nvcr.io/nvidia/pytorch:1", "something else", 500, "pull", "failed: something else", None),
    ],
)
def test_pull_errors(
    reference: str, explanation: str, status: int, verb: str, fragment: str, hint: str | None
) -> None:
    error = pull_error(reference, explanation, status, verb)
    assert fragment in error.message
    assert error.exit_code == 11
    if hint is None:
        assert error.hint is None
    else:
        assert hint in (error.hint or ""), error.hint
        others = ("`gpuenv matrix`", "NGC_API_KEY", "GPUENV_REGISTRY_MIRROR=host:port")
        for other in others:  # a hint for another case never rides along
            if other != hint and other not in hint:
                assert other not in (error.hint or ""), (other, error.hint)
