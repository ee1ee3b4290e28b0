"""What a pulled image says of itself against gpuenv.lock (issue 22, item 3): the NGC
environment of the 25.10 stand-in (scripts/services/images.sh copies NGC PyTorch
25.10's: PYTORCH_BUILD_VERSION 2.9.0a0+145a3a7, CUDA_VERSION 13.0.2.006, CUDNN_VERSION
9.14.0.64, NVIDIA_PYTORCH_VERSION 25.10, Ubuntu 24.04's labels)."""

from __future__ import annotations

import pytest

from gpuenv.lock.facts import image_facts, reconcile

CONFIG = {
    "Env": [
        "CUDA_VERSION=13.0.2.006",
        "CUDNN_VERSION=9.14.0.64",
        "PYTORCH_BUILD_VERSION=2.9.0a0+145a3a7",
        "NVIDIA_PYTORCH_VERSION=25.10",
    ],
    "Labels": {
        "org.opencontainers.image.ref.name": "ubuntu",
        "org.opencontainers.image.version": "24.04",
    },
}


def test_the_facts_an_ngc_image_states() -> None:
    assert image_facts("pytorch", CONFIG) == {
        "framework_version": "2.9.0a0+145a3a7",
        "release": "25.10",
        "cuda": "13.0.2",
        "cudnn": "9.14.0.64",
        "ubuntu": "24.04",
    }
    assert image_facts("pytorch", None) == {}
    assert image_facts("jax", CONFIG)["cuda"] == "13.0.2"  # JAX images state no JAX version


@pytest.mark.parametrize(
    ("locked", "filled", "contradictions"),
    [
        # the matrix's 25.10 row spells the commit long: the same build
        (
            {"framework_version": "2.9.0a0+145a3a7bda", "cuda": "13.0.2", "release": "25.10"},
            ["cudnn 9.14.0.64", "ubuntu 24.04"],
            [],
        ),
        # what the lock did not know is filled in
        (
            {"framework_version": None, "cuda": "13.0.2", "cudnn": None},
            [
                "framework_version 2.9.0a0+145a3a7",
                "cudnn 9.14.0.64",
                "release 25.10",
                "ubuntu 24.04",
            ],
            [],
        ),
        # another build, another CUDA: refused
        (
            {
                "framework_version": "2.8.0a0+5228986c39",
                "cuda": "12.9.1",
                "release": "25.10",
                "cudnn": "9.14.0.64",
                "ubuntu": "24.04",
            },
            [],
            [
                "framework_version: the lock says 2.8.0a0+5228986c39, the image 2.9.0a0+145a3a7",
                "cuda: the lock says 12.9.1, the image 13.0.2",
            ],
        ),
    ],
)
def test_the_lock_is_reconciled_with_the_image(
    locked: dict[str, str | None], filled: list[str], contradictions: list[str]
) -> None:
    merged, got_filled, got_contradictions = reconcile(locked, image_facts("pytorch", CONFIG))
    assert sorted(got_filled) == sorted(filled)
    assert got_contradictions == contradictions
    for item in filled:
        field, _, value = item.partition(" ")
        assert merged[field] == value
