"""The usage index (issue 33, item 11): `gpuenv usage` and `/api/usage` sum a year of
records from SQLite, and must say exactly what adding up `UsageLog.runs()` says, after
appends, torn lines, a file rewritten or truncated, and for every grouping and window."""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import pytest

from gpuenv.monitoring.usage import UsageLog, summarize, usage_summary

A100, H100 = "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"
NOW = time.time()


@pytest.fixture
def log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> UsageLog:
    monkeypatch.setenv("GPUENV_CACHE_DIR", str(tmp_path / "cache"))
    return UsageLog(str(tmp_path / "state"))


def record(log: UsageLog, rng: random.Random, count: int) -> None:
    for _ in range(count):
        start = NOW - rng.uniform(0, 40 * 86400)
        gpus = [(f"GPU-{i}", rng.choice([A100, H100])) for i in range(rng.randint(1, 3))]
        run = log.begin(rng.choice(["llm", "vision", "rl"]), gpus, start=start)
        if rng.random() < 0.9:
            log.finish(run, rng.choice([0, 1, None]), end=start + rng.uniform(10, 20 * 3600))


def same(log: UsageLog) -> None:
    runs = log.runs()
    prices = {A100: 2.0, H100: 4.0}
    for by in ("user", "project", "gpu"):
        for since in (0.0, NOW - 7 * 86400, NOW - 90 * 60):
            want = summarize(runs, by, since, NOW, prices)
            got = usage_summary(log, by, since, NOW, prices)
            assert [(r.key, r.runs) for r in got.rows] == [(r.key, r.runs) for r in want]
            assert [r.gpu_hours for r in got.rows] == pytest.approx([r.gpu_hours for r in want])
            assert [r.cost for r in got.rows] == pytest.approx([r.cost for r in want])
            assert got.unrecorded == sum(1 for r in runs if r.state == "unrecorded")


def test_the_index_says_what_the_records_say(log: UsageLog, tmp_path: Path) -> None:
    rng = random.Random(33)
    record(log, rng, 200)
    same(log)
    record(log, rng, 50)  # appended since: read from where the index stopped
    same(log)
    mine = Path(log.directory) / f"{os.getuid()}.jsonl"
    with open(mine, "a") as handle:  # a torn line, and a forged start of another uid
        handle.write('{"event": "start", "id": "abc", "uid": 4242, "start": 1, "gpus": []}\n')
        handle.write('{"event": "end", "id": "tor')
    same(log)
    lines = mine.read_text().splitlines(keepends=True)
    mine.write_text("".join(lines[: len(lines) // 2]))  # rewritten shorter (same inode)
    same(log)
    data = mine.read_text().replace('"project": "llm"', '"project": "LLM"')
    mine.write_text(data)  # rewritten, the same length: the prefix's digest tells
    same(log)
    assert any(row.key == "LLM" for row in usage_summary(log, "project", 0.0, NOW).rows)


def test_one_owners_view(log: UsageLog) -> None:
    record(log, random.Random(1), 20)
    me = os.getuid()
    assert usage_summary(log, "user", 0.0, NOW, only=me).rows
    assert usage_summary(log, "user", 0.0, NOW, only=me + 1).rows == []


def test_without_a_cache_folder_the_records_are_read_whole(
    log: UsageLog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record(log, random.Random(2), 20)
    blocked = tmp_path / "blocked"
    blocked.write_text("a file, not a folder")
    monkeypatch.setenv("GPUENV_CACHE_DIR", str(blocked / "cache"))
    same(log)


def test_the_index_is_the_readers_own(log: UsageLog, tmp_path: Path) -> None:
    record(log, random.Random(3), 5)
    usage_summary(log, "user", 0.0, NOW)
    (index,) = (tmp_path / "cache").glob("usage-*.sqlite")
    assert index.stat().st_mode & 0o077 == 0 and index.stat().st_uid == os.getuid()
    json.dumps([r.to_data() for r in usage_summary(log, "gpu", 0.0, NOW).rows])
