"""Account images (images/accounts.py) against a fake engine: when a run may trust one,
and how `gpuenv images` and `gpuenv gc` treat them (with the image they come from)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpuenv.engine.protocol import ImageInfo
from gpuenv.images.accounts import (
    ACCOUNT_BASE_LABEL,
    ACCOUNT_LABEL,
    Identity,
    account_image,
    account_tag,
    image_accounts,
    usable_account_image,
)
from gpuenv.images.inventory import collect, list_images

from .fake_engine import FakeEngine

ALICE = Identity(1000, 1000, "alice")
TAG = "gpuenv/demo:0123456789abcdef"


@dataclass
class _Listing(FakeEngine):
    """A fake engine with images to list (by label, as the engine filters them)."""

    infos: list[ImageInfo] = field(default_factory=list)

    def images(self, label: str | None = None) -> list[ImageInfo]:
        return [i for i in self.infos if label is None or label in i.labels]


def _image(tag: str, folder: Path, **extra: str) -> ImageInfo:
    labels = {"io.gpuenv.project": "demo", "io.gpuenv.project-dir": str(folder), **extra}
    return ImageInfo(id=f"sha256:{abs(hash(tag)):x}", tags=(tag,), labels=labels)


def test_an_account_image_is_made_and_then_trusted() -> None:
    engine = FakeEngine()
    made = account_image(engine, TAG, ALICE, ("root:x:0:0::/root:/bin/sh\n", "root:x:0:\n"))
    assert made == account_tag(TAG, ALICE) == f"{TAG}-u1000"
    recorded = {"tag": made, "for": ALICE.key}
    assert usable_account_image(engine, recorded, TAG, ALICE) == made


@pytest.mark.parametrize(
    ("recorded", "who", "labels"),
    [
        (None, ALICE, None),
        ({"tag": f"{TAG}-u1000", "for": ALICE.key}, None, None),  # root: no account
        ({"tag": f"{TAG}-u1000", "for": "1000:1000:bob"}, ALICE, None),
        ({"tag": f"{TAG}-u1001", "for": ALICE.key}, ALICE, None),
        ({"tag": f"{TAG}-u1000", "for": ALICE.key}, Identity(1000, 1000, "alicia"), None),
        ({"tag": f"{TAG}-u1000", "for": ALICE.key}, ALICE, {ACCOUNT_LABEL: "1000:1000:eve"}),
        ({"tag": f"{TAG}-u1000", "for": ALICE.key}, ALICE, {ACCOUNT_BASE_LABEL: "gpuenv/x:1"}),
    ],
    ids=["none", "root", "other-user", "other-uid", "renamed", "label-user", "label-base"],
)
def test_an_account_image_that_does_not_fit_is_not_trusted(
    recorded: dict[str, str] | None, who: Identity | None, labels: dict[str, str] | None
) -> None:
    engine = FakeEngine()
    good = {ACCOUNT_LABEL: ALICE.key, ACCOUNT_BASE_LABEL: TAG}
    engine.image_configs[f"{TAG}-u1000"] = {"Labels": {**good, **(labels or {})}}
    engine.image_configs[f"{TAG}-u1001"] = {"Labels": good}
    assert usable_account_image(engine, recorded, TAG, who) is None


def test_images_leaves_account_images_out_and_gc_removes_them_with_their_image(
    tmp_path: Path,
) -> None:
    gone = tmp_path / "gone"  # a project folder that no longer exists: its images go
    base = _image(TAG, gone)
    child = _image(f"{TAG}-u1000", gone, **{ACCOUNT_LABEL: ALICE.key, ACCOUNT_BASE_LABEL: TAG})
    other = _image(  # of another image, which stays
        "gpuenv/demo:fedcba9876543210-u1000",
        gone,
        **{ACCOUNT_LABEL: ALICE.key, ACCOUNT_BASE_LABEL: "gpuenv/demo:fedcba9876543210"},
    )
    engine = _Listing(infos=[base, child, other])
    rows = list_images(engine, None)
    assert [row.info.tags for row in rows] == [(TAG,)]
    outcome = collect(engine, rows, remove=True)
    removed: list[Any] = [args[0] for name, args in engine.calls if name == "remove_image"]
    assert removed == [f"{TAG}-u1000", TAG]  # the child first, then its image
    assert [row.info.tags for row in outcome.removed] == [(TAG,)]


class _BrokenArchive(FakeEngine):
    """An engine whose archive of one path fails as `failure`."""

    def __init__(self, path: str, failure: BaseException) -> None:
        super().__init__()
        self.path, self.failure = path, failure
        self.removed_after: list[str] = []

    def get_archive(self, container: str, path: str) -> bytes | None:
        if path == self.path:
            raise self.failure
        return super().get_archive(container, path)

    def remove(self, container: str) -> None:
        self.removed_after.append(container)
        super().remove(container)


@pytest.mark.parametrize("path", ["/etc/passwd", "/etc/group"])
def test_the_accounts_read_says_what_failed(path: str) -> None:
    """An engine refusal of either file is "cannot say" (None), anything else is raised
    as itself, and the probe is removed either way."""
    from gpuenv.errors import EngineError

    refused = _BrokenArchive(path, EngineError("no such container"))
    assert image_accounts(refused, "gpuenv/demo:1") is None
    broken = _BrokenArchive(path, ValueError("not a tar"))
    with pytest.raises(ValueError, match="not a tar"):
        image_accounts(broken, "gpuenv/demo:1")
    assert refused.removed_after and broken.removed_after
