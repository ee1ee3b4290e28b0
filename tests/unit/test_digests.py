"""A baked build reads each unchanged file once, in its streamed context (issue 33, item
7): the tag's content digests are remembered by stat between builds, and the context is
a stream of chunks, never the whole project in memory."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from gpuenv.images import digests
from gpuenv.images.digests import Digests


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUENV_CACHE_DIR", str(tmp_path / "cache"))


def test_an_unchanged_file_is_not_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    for name in ("a.py", "b.py", "data.bin"):
        (project / name).write_bytes(name.encode() * 1000)
    read: list[str] = []
    real = digests.file_digest
    monkeypatch.setattr(digests, "file_digest", lambda path: read.append(path) or real(path))

    first = Digests(str(project))
    sums = {p.name: first.of(str(p)) for p in sorted(project.iterdir())}
    first.save()
    assert len(read) == 3

    read.clear()
    (project / "b.py").write_bytes(b"changed")
    again = Digests(str(project))
    assert {p.name: again.of(str(p)) for p in sorted(project.iterdir())}["a.py"] == sums["a.py"]
    assert read == [str(project / "b.py")]  # only the edited file is read to hash it
    assert again.of(str(project / "b.py")) != sums["b.py"]


def test_the_context_streams_in_chunks_and_is_a_valid_tar(tmp_path: Path) -> None:
    from gpuenv.images.context import ContextFile
    from gpuenv.images.render import BuildPlan

    big = tmp_path / "big.bin"
    with open(big, "wb") as handle:
        handle.truncate(5 * digests.CHUNK + 123)  # sparse: 5 MiB and a bit
    link = tmp_path / "link"
    os.symlink("big.bin", link)
    plan = BuildPlan(
        "FROM base\n",
        "FROM base\n",
        (
            ContextFile("project/big.bin", path=str(big)),
            ContextFile("project/link", link="big.bin"),
            ContextFile("requirements/a.txt", data=b"x==1\n"),
        ),
        "gpuenv/t:1",
    )
    chunks = list(plan.context())
    assert max(len(c) for c in chunks) <= digests.CHUNK  # never the whole file at once
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as archive:
        names = archive.getnames()
        assert names == ["Dockerfile", "project/big.bin", "project/link", "requirements/a.txt"]
        member = archive.extractfile("project/big.bin")
        assert member is not None and len(member.read()) == 5 * digests.CHUNK + 123
        assert archive.getmember("project/link").linkname == "big.bin"
