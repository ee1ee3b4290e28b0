"""GPU-hours (gpuenv/monitoring/usage.py): records that survive crashes and stay private,
the sums per user, project and GPU model, and the runs that leave them."""

from __future__ import annotations

import fcntl
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from gpuenv.errors import UsageError
from gpuenv.monitoring.usage import (
    UsageLog,
    UsageRun,
    load_prices,
    parse_since,
    summarize,
)
from gpuenv.monitoring.usage_files import append
from gpuenv.reservations.statedir import owner_name

A100, H100 = "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"
HOUR = 3600.0
NOW = 1_800_000_000.0


def run(
    user: str, project: str, hours: float, *models: str, end: float = NOW, state: str = "ended"
) -> UsageRun:
    gpus = tuple((f"GPU-{i}", model) for i, model in enumerate(models))
    return UsageRun(
        "r" + user + project, user, 1000, project, end - hours * HOUR, gpus, end, 0, state
    )


RUNS = [
    run("alice", "llm", 2, A100, A100),  # 4 GPU-hours
    run("alice", "vision", 1, H100),  # 1
    run("bob", "llm", 3, A100),  # 3
    run("bob", "llm", 10, H100, end=NOW - 20 * 86400),  # 10, three weeks ago
    run("carol", "llm", 5, A100, state="unrecorded", end=NOW),  # never counted
]


@pytest.mark.parametrize(
    ("by", "since", "expected"),
    [
        ("user", 0, [("bob", 2, 13.0), ("alice", 2, 5.0)]),
        ("user", NOW - 7 * 86400, [("alice", 2, 5.0), ("bob", 1, 3.0)]),
        ("project", 0, [("llm", 3, 17.0), ("vision", 1, 1.0)]),
        ("gpu", 0, [(H100, 2, 11.0), (A100, 2, 7.0)]),
        ("user", NOW - 1.5 * HOUR, [("alice", 2, 4.0), ("bob", 1, 1.5)]),  # cut at since
    ],
)
def test_gpu_hours_add_up(by: str, since: float, expected: list[tuple[str, int, float]]) -> None:
    rows = summarize(RUNS, by, since, NOW)
    assert [(r.key, r.runs, round(r.gpu_hours, 6)) for r in rows] == expected
    assert all(r.cost is None for r in rows)


def test_cost_from_prices_and_unknown_without_one() -> None:
    rows = summarize(RUNS[:3], "project", 0, NOW, {A100: 2.0, H100: 4.0})
    assert [(r.key, r.cost) for r in rows] == [("llm", 14.0), ("vision", 4.0)]
    rows = summarize(RUNS[:3], "user", 0, NOW, {A100: 2.0})
    assert {r.key: r.cost for r in rows} == {"alice": None, "bob": 6.0}


def test_a_running_run_counts_until_now() -> None:
    running = UsageRun("x", "alice", 1000, "llm", NOW - HOUR, (("GPU-0", A100),), state="running")
    assert summarize([running], "user", 0, NOW)[0].gpu_hours == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30m", NOW - 1800),
        ("12h", NOW - 12 * HOUR),
        ("7d", NOW - 7 * 86400),
        ("2w", NOW - 14 * 86400),
        ("2026-11-01", 1793491200.0),
    ],
)
def test_since(text: str, expected: float) -> None:
    assert parse_since(text, NOW) == expected


@pytest.mark.parametrize("text", ["7", "d", "yesterday", "7y", "2026-13-01"])
def test_bad_since(text: str) -> None:
    with pytest.raises(UsageError, match="--since"):
        parse_since(text, NOW)


def test_records_round_trip_private_and_torn_lines_skipped(tmp_path: Path) -> None:
    log = UsageLog(str(tmp_path))
    first = log.begin("llm", [("GPU-0", A100), ("GPU-1", A100)], start=NOW - 2 * HOUR)
    log.finish(first, 0, end=NOW)
    second = log.begin("llm", [("GPU-2", A100)])  # still running: this process lives
    path = tmp_path / "usage" / f"{os.getuid()}.jsonl"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "usage").stat().st_mode) == 0o1777
    with path.open("a") as handle:
        handle.write('{"event": "end", "id": "' + second[:5])  # a crash mid-line
    runs = {r.id: r for r in log.runs()}
    assert (runs[first].state, runs[first].end, runs[first].exit) == ("ended", NOW, 0)
    assert runs[first].gpus == (("GPU-0", A100), ("GPU-1", A100))
    assert runs[second].state == "running" and runs[second].end is None
    records = [json.loads(line) for line in path.read_text().splitlines()[:3]]
    assert [r["event"] for r in records] == ["start", "end", "start"]
    assert records[0]["project"] == "llm" and records[0]["uid"] == os.getuid()


def test_a_run_whose_process_died_is_unrecorded_until_reaped(tmp_path: Path) -> None:
    log = UsageLog(str(tmp_path))
    run_id = log.begin("llm", [("GPU-0", A100)], start=NOW - HOUR)
    path = tmp_path / "usage" / f"{os.getuid()}.jsonl"
    record = json.loads(path.read_text())
    record["pid_start"] = "1"  # the same pid, another process: it is gone
    path.write_text(json.dumps(record) + "\n")
    assert [r.state for r in log.runs()] == ["unrecorded"]
    log.finish_for(f"{os.getuid()}/{run_id}", None, end=NOW)
    (reaped,) = log.runs()
    assert (reaped.state, reaped.end, reaped.exit) == ("ended", NOW, None)


def test_root_ends_another_users_run_in_their_file(tmp_path: Path) -> None:
    log = UsageLog(str(tmp_path))
    owner = os.getuid() + 1 if os.getuid() else 4242
    log.finish_for(f"{owner}/abc123", 7, end=NOW)
    path = tmp_path / "usage" / f"{owner}.jsonl"
    if os.getuid() != 0:  # another user's record of it would not be believed
        assert not path.exists()
        return
    assert path.stat().st_uid == owner and json.loads(path.read_text())["exit"] == 7
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.parametrize("label", ["", "x/abc", "1000/../../etc", "1000/"])
def test_malformed_usage_labels_are_ignored(tmp_path: Path, label: str) -> None:
    UsageLog(str(tmp_path)).finish_for(label, 0)
    assert not (tmp_path / "usage").exists()


def test_each_user_reads_their_own_rows_root_all(tmp_path: Path) -> None:
    folder = tmp_path / "usage"
    folder.mkdir()
    for uid, user in ((1000, "alice"), (1001, "bob")):
        if os.getuid() != 0:
            pytest.skip("writes files owned by other users")
        start = {
            "event": "start",
            "id": f"id{uid}",
            "user": user,
            "uid": uid,
            "project": "p",
            "start": NOW - HOUR,
            "gpus": [{"key": "GPU-0", "model": A100}],
            "host": "h",
        }
        end = {"event": "end", "id": f"id{uid}", "end": NOW, "exit": 0}
        (folder / f"{uid}.jsonl").write_text(json.dumps(start) + "\n" + json.dumps(end) + "\n")
        os.chown(folder / f"{uid}.jsonl", uid, uid)
    log = UsageLog(str(tmp_path))
    assert [r.uid for r in log.runs(uid=1000)] == [1000]
    assert sorted(r.user for r in log.runs(uid=0)) == sorted([owner_name(1000), owner_name(1001)])
    assert log.runs(uid=1002) == []


def test_one_writer_at_a_time_with_a_timeout(tmp_path: Path) -> None:
    path = tmp_path / "usage.jsonl"
    path.touch(mode=0o600)
    directory = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        started = time.monotonic()
        with pytest.raises(UsageError, match=r"stayed locked by another gpuenv for 0\.3s"):
            append(directory, path.name, {"event": "start"}, os.getuid(), str(path), 0.3)
        assert time.monotonic() - started >= 0.3
        fcntl.flock(fd, fcntl.LOCK_UN)
        append(directory, path.name, {"event": "start"}, os.getuid(), str(path), 1.0)
    finally:
        os.close(fd)
        os.close(directory)
    assert path.read_text() == '{"event": "start"}\n'


def test_a_planted_symlink_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("")
    (tmp_path / "usage").mkdir()
    (tmp_path / "usage" / f"{os.getuid()}.jsonl").symlink_to(target)
    with pytest.raises(UsageError, match="cannot write usage records"):
        UsageLog(str(tmp_path)).begin("llm", [])
    assert target.read_text() == ""


def test_prices_from_the_host_config(tmp_path: Path) -> None:
    config = tmp_path / "host.yaml"
    config.write_text(f"currency: EUR\ngpu_hour_prices:\n  {A100}: 2.1\n  {H100}: 4\n")
    prices = load_prices({"GPUENV_HOST_CONFIG": str(config)})
    assert prices is not None and prices.currency == "EUR"
    assert prices.per_gpu_hour == {A100: 2.1, H100: 4.0}
    assert load_prices({"GPUENV_HOST_CONFIG": ""}) is None or os.path.exists(
        "/etc/gpuenv/host.yaml"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("prices: {}\n", "expected the keys 'currency' and 'gpu_hour_prices' only"),
        ("gpu_hour_prices: {A100: cheap}\n", "must map GPU models"),
        ("gpu_hour_prices: {A100: -1}\n", "must map GPU models"),
        ("gpu_hour_prices: [1, 2]\n", "must map GPU models"),
        ("a: [\n", "cannot read the host config"),
    ],
)
def test_bad_host_configs(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "host.yaml"
    config.write_text(text)
    with pytest.raises(UsageError, match=message):
        load_prices({"GPUENV_HOST_CONFIG": str(config)})
    with pytest.raises(UsageError, match="no such file"):
        load_prices({"GPUENV_HOST_CONFIG": str(tmp_path / "missing.yaml")})


def test_a_run_leaves_its_record_and_a_reaped_one_its_end(tmp_path: Path) -> None:
    """launch() against the fake engine: start and end records with the GPUs' models,
    the usage label on the container; and an orphan's end written by the next run."""
    import socket

    from gpuenv.app.launch import RunRequest, Services, Terminal, launch
    from gpuenv.reservations.claims import ClaimStore
    from tests.unit.fake_engine import FakeEngine
    from tests.unit.test_launch import ALICE, HOST, _NullView, project

    folder = project.__wrapped__(tmp_path)  # type: ignore[attr-defined]
    state = str(tmp_path / "state")
    orphan_label = f"{os.getuid()}/deadbeef00000000"
    start = {
        "event": "start",
        "id": "deadbeef00000000",
        "user": "alice",
        "uid": os.getuid(),
        "project": "old",
        "start": time.time() - 60,
        "gpus": [{"key": "GPU-3", "model": H100}],
        "host": socket.gethostname(),
        "pid": 1,
        "pid_start": "0",
    }
    _write(Path(state), os.getuid(), [start])
    engine = FakeEngine(exit_code=3)
    engine.listed = [
        {
            "Id": "f" * 64,
            "Names": ["/old_run"],
            "State": "running",
            "Labels": {
                "io.gpuenv.run": "1",
                "io.gpuenv.host": socket.gethostname(),
                "io.gpuenv.pid": "999999",
                "io.gpuenv.pid-start": "1",
                "io.gpuenv.usage": orphan_label,
            },
        }
    ]
    notices: list[str] = []
    outcome = launch(
        str(folder),
        RunRequest(("train.py",), gpus="2"),
        engine,  # type: ignore[arg-type]
        services=Services(
            lambda: HOST,
            lambda: ClaimStore(state),
            lambda: ALICE,
            usage_log=lambda: UsageLog(state),
        ),
        terminal=Terminal(uid=1000),
        environ={},
        view=lambda: _NullView(),  # type: ignore[arg-type,return-value]
        notice=notices.append,
    )
    assert outcome.exit_code == 3
    label = engine.created[0]["Labels"]["io.gpuenv.usage"]
    assert label.startswith(f"{os.getuid()}/")
    runs = {r.id: r for r in UsageLog(state).runs()}
    mine = runs[label.split("/")[1]]
    assert (mine.state, mine.exit, mine.project) == ("ended", 3, "proj")
    assert mine.gpus == (("GPU-0", "NVIDIA H100 80GB HBM3"), ("GPU-1", "NVIDIA H100 80GB HBM3"))
    old = runs["deadbeef00000000"]
    assert old.state == "ended" and old.exit is None and old.end is not None
    assert "removed old_run, left behind by a gpuenv run that was killed" in notices


def test_the_usage_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from gpuenv.cli.tree import main

    log = UsageLog(str(tmp_path))
    now = time.time()
    for project, hours, gpus in (
        ("llm", 2, [("GPU-0", A100), ("GPU-1", H100)]),
        ("vision", 1, [("GPU-2", A100)]),
    ):
        run_id = log.begin(project, gpus, start=now - hours * HOUR)
        log.finish(run_id, 0, end=now)
    config = tmp_path / "host.yaml"
    config.write_text(f"currency: EUR\ngpu_hour_prices:\n  {A100}: 2\n  {H100}: 4\n")
    monkeypatch.setenv("GPUENV_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("GPUENV_HOST_CONFIG", str(config))
    result = CliRunner().invoke(main, ["usage", "--by", "project", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["rows"] == [
        {"key": "llm", "runs": 1, "gpu_hours": 4.0, "cost": 12.0},
        {"key": "vision", "runs": 1, "gpu_hours": 1.0, "cost": 2.0},
    ]
    table = CliRunner().invoke(main, ["usage", "--by", "gpu", "--since", "90m"], terminal_width=100)
    assert table.exit_code == 0
    # Piped: plain tab-separated rows under a header, as every table (issue 12).
    header, *rows = table.stdout.splitlines()
    assert header.split("\t") == ["gpu", "runs", "GPU-hours", "cost"]
    cells = [row.split("\t") for row in rows]
    # Since 90 minutes ago: llm 1.5 h on each of its GPUs, vision 1 h.
    assert cells == [[A100, "2", "2.50", "5.00 EUR"], [H100, "1", "1.50", "6.00 EUR"]]
    bad = CliRunner().invoke(main, ["usage", "--since", "soon"])
    assert bad.exit_code == 2 and "--since 'soon'" in bad.output


def _write(state: Path, owner: int, records: list[dict[str, Any]], name: str = "") -> Path:
    """Records as `owner`'s file would hold them (owned by `owner`: tests run as root)."""
    folder = state / "usage"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.chmod(0o1777)
    path = folder / (name or f"{owner}.jsonl")
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    path.chmod(0o600)
    os.chown(path, owner, owner)
    return path
