"""The dashboard's history: one SQLite database per sampling user in the state folder,
one sampler at a time, retention and a size cap, and nothing another user planted."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuenv.app.sampler import HistorySettings, Sampler
from gpuenv.common.versions import DriverVersion
from gpuenv.errors import StateUnsafe, UsageError
from gpuenv.host.machine import Gpu, Host
from gpuenv.monitoring.history import History, SamplerBusy, Xid
from gpuenv.reservations.statedir import Folder, open_state

UUID = "GPU-00000000-1111-2222-3333-444444444444"


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Folder]:
    opened = open_state(directory=str(tmp_path / "state"))
    yield opened
    opened.close()


def a100(utilization: int | None, **readings: Any) -> Gpu:
    return Gpu(0, "NVIDIA A100-SXM4-80GB", uuid=UUID, utilization=utilization, **readings)


def test_samples_come_back_averaged_per_bucket_with_unknown_readings_null(folder: Folder) -> None:
    history = History.for_sampling(folder, 16)
    now = 1_000_000.0
    for second, utilization in ((0, 10), (5, 30), (20, None)):
        history.record(now - 3600 + second, [a100(utilization, temperature_c=50)], [])
    points = history.series(UUID, now - 3600, points=240, now=now)  # 15 s buckets
    assert [(p["utilization"], p["temperature_c"]) for p in points] == [(20.0, 50.0), (None, 50.0)]
    assert points[0]["power_w"] is None  # never reported: unknown, not 0
    history.close()


def test_retention_forgets_older_rows_and_xids(folder: Folder) -> None:
    history = History.for_sampling(folder, 16)
    history.record(100.0, [a100(1)], [Xid(100.0, UUID, 0, 79)])
    history.record(200.0, [a100(2)], [Xid(200.0, UUID, 0, 48)])
    history.prune(before=150.0)
    assert [p["utilization"] for p in history.series(UUID, 0, now=300.0)] == [2.0]
    assert [x.xid for x in history.xids(0)] == [48]
    history.close()


def test_a_full_database_drops_its_oldest_samples_instead_of_failing(folder: Folder) -> None:
    history = History.for_sampling(folder, 1)  # 1 MiB
    gpus = [Gpu(i, "NVIDIA A100-SXM4-80GB", uuid=f"GPU-{i}", utilization=i) for i in range(256)]
    for second in range(150):
        history.record(float(second), gpus, [])
    assert os.path.getsize(history.path) <= 2**20
    first = history.connection.execute("SELECT min(t), max(t) FROM samples").fetchone()
    assert first[0] > 0 and first[1] == 149.0
    history.close()


def test_one_sampler_per_database_and_the_next_one_takes_over(folder: Folder) -> None:
    first = History.for_sampling(folder, 16)
    with pytest.raises(SamplerBusy):
        History.for_sampling(folder, 16)
    first.record(1.0, [a100(5)], [])
    first.close()
    second = History.for_sampling(folder, 16)  # the lock went with the first
    assert second.last_sample() == 1.0
    second.close()


def test_only_its_user_opens_the_database(folder: Folder) -> None:
    assert History.for_reading(folder) is None  # nothing sampled yet
    history = History.for_sampling(folder, 16)
    history.record(5.0, [a100(7)], [])
    assert os.stat(history.path).st_mode & 0o777 == 0o600  # no other user opens it
    assert os.stat(Path(history.path).parent / "sampler.lock").st_mode & 0o777 == 0o600
    assert os.stat(Path(history.path).parent).st_mode & 0o777 == 0o755
    history.close()
    reader = History.for_reading(folder)
    assert reader is not None and reader.last_sample() == 5.0
    reader.close()


def test_a_journal_a_killed_sampler_left_is_rolled_back_by_the_next_reader(
    folder: Folder, tmp_path: Path
) -> None:
    """SIGKILL in the middle of a write: the next opener (its own user) rolls it back."""
    history = History.for_sampling(folder, 16)
    gpus = [Gpu(i, "NVIDIA A100-SXM4-80GB", uuid=f"GPU-{i}", utilization=1) for i in range(500)]
    history.record(1.0, gpus, [])
    path = history.path
    history.close()
    # A writer that spills its changes into the file before committing, then dies.
    script = (
        "import os, sqlite3, sys\n"
        "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "c.execute('PRAGMA cache_size=1')\n"
        "c.execute('BEGIN IMMEDIATE')\n"
        "c.execute('UPDATE samples SET t = 99, name = hex(randomblob(64))')\n"
        "os.kill(os.getpid(), 9)\n"
    )
    subprocess.run([sys.executable, "-c", script, path], check=False)
    assert os.path.exists(path + "-journal")  # hot: only a writer can roll it back
    reader = History.for_reading(folder)
    assert reader is not None and reader.last_sample() == 1.0  # the half-written round is gone
    reader.close()
    sampler = History.for_sampling(folder, 16)  # and the next sampler goes on
    sampler.record(2.0, [a100(2)], [])
    assert sampler.last_sample() == 2.0
    sampler.close()


@pytest.mark.parametrize(
    ("plant", "message"),
    [
        ("folder symlink", "is not a folder gpuenv made"),
        ("folder of another user", "belongs to"),
        ("folder others may write", "may be written by others"),
        ("database symlink", "is not a database"),
    ],
)
def test_what_another_user_planted_is_refused(
    folder: Folder, tmp_path: Path, plant: str, message: str
) -> None:
    own = Path(folder.path) / f"history-{os.getuid()}"
    if plant == "folder symlink":
        (tmp_path / "elsewhere").mkdir()
        own.symlink_to(tmp_path / "elsewhere")
    else:
        own.mkdir(mode=0o755)
        if plant == "folder of another user":
            if os.getuid() != 0:
                pytest.skip("needs root to make a folder of another user's")
            os.chown(own, 4321, 4321)
        elif plant == "folder others may write":
            own.chmod(0o777)
        else:
            (own / "gpus.sqlite").symlink_to(tmp_path / "victim")
    with pytest.raises(StateUnsafe, match=message):
        History.for_sampling(folder, 16)
    with pytest.raises(StateUnsafe, match=message):
        History.for_reading(folder)
    assert not (tmp_path / "victim").exists()


class Listener:
    """NvmlListener's interface, with XID counts a test sets."""

    def __init__(self) -> None:
        self.counts: dict[tuple[int, int], int] = {}

    def drain(self) -> None:
        pass

    def xids(self, index: int) -> tuple[int, ...]:
        return tuple(x for (gpu, x) in self.counts if gpu == index)


def test_the_sampler_records_each_xid_event_once(folder: Folder) -> None:
    history = History.for_sampling(folder, 16)
    listener = Listener()
    host = Host(DriverVersion.parse("550.54.15"), (a100(3),), "nvml")
    sampler = Sampler(history, HistorySettings(), lambda _: host, listener)  # type: ignore[arg-type]
    listener.counts[(0, 79)] = 1
    sampler.round(100.0)
    sampler.round(101.0)  # the same count: nothing new
    listener.counts[(0, 79)] = 3
    sampler.round(102.0)
    assert sorted((x.at, x.xid) for x in history.xids(0)) == [(100.0, 79), (102.0, 79), (102.0, 79)]
    history.close()


def test_a_host_files_xids_count_once(folder: Folder) -> None:
    history = History.for_sampling(folder, 16)
    host = Host(DriverVersion.parse("550.54.15"), (a100(3, xids=(48,)),), "file:/etc/host.yaml")
    sampler = Sampler(history, HistorySettings(), lambda _: host, Listener())  # type: ignore[arg-type]
    sampler.round(100.0)
    sampler.round(200.0)
    assert [(x.at, x.xid) for x in history.xids(0)] == [(100.0, 48)]
    # A new sampler (the dashboard started again) on the same history: still once.
    again = Sampler(history, HistorySettings(), lambda _: host, Listener())  # type: ignore[arg-type]
    again.round(300.0)
    assert [(x.at, x.xid) for x in history.xids(0)] == [(100.0, 48)]
    history.close()


def test_a_round_without_nvml_says_why(folder: Folder) -> None:
    history = History.for_sampling(folder, 16)
    sampler = Sampler(history, HistorySettings(), lambda _: "NVML: not loaded", Listener())  # type: ignore[arg-type]
    sampler.round(1.0)
    assert sampler.note == "NVML: not loaded" and history.last_sample() is None
    history.close()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", HistorySettings()),
        (
            '[history]\ninterval = "5s"\nretention = "30d"\nmax_mib = 64\n',
            HistorySettings(5, 30 * 86400, 64),
        ),
        ("[history]\ninterval = 60\n", HistorySettings(60, 7 * 86400, 256)),
        ('[history]\ninterval = "soon"\n', "[history] interval = 'soon' is not a duration"),
        ("[history]\nmax_mib = 0\n", "is not a size in MiB"),
        ("[history]\nkeep = 1\n", "takes interval, retention and max_mib only"),
    ],
)
def test_history_settings(tmp_path: Path, text: str, expected: HistorySettings | str) -> None:
    config = tmp_path / "config.toml"
    config.write_text(text)
    config.chmod(0o644)
    env = {"GPUENV_SYSTEM_CONFIG": str(config)}
    if isinstance(expected, str):
        with pytest.raises(UsageError, match=expected.replace("[", r"\[").replace("]", r"\]")):
            HistorySettings.load(env)
    else:
        assert HistorySettings.load(env) == expected


def test_top_and_doctor_see_the_xids_a_sampler_recorded_in_the_last_day(
    folder: Folder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sampler publishes them (xids.json, 0644); every user's `top` and `doctor`
    read that, never the database; a past XID is at most a warning, with its time."""
    from gpuenv.monitoring.history import recorded_findings

    monkeypatch.setenv("GPUENV_STATE_DIR", folder.path)
    history = History.for_sampling(folder, 16)
    now = time.time()
    history.record(now - 2 * 86400, [a100(0)], [Xid(now - 2 * 86400, UUID, 0, 48)])  # too old
    history.record(now - 600, [a100(0)], [Xid(now - 600, UUID, 0, 79)])
    history.publish_xids(now - 86400)
    history.close()
    published = Path(folder.path) / f"history-{os.getuid()}" / "xids.json"
    assert published.stat().st_mode & 0o777 == 0o644
    (finding,) = recorded_findings([a100(0)], now=now)
    assert finding.kind == "xid" and finding.severity == "warn"  # XID 79 is "fail" when live
    assert finding.message.startswith("GPU 0 fell off the bus (XID 79), recorded at ")
    assert recorded_findings([Gpu(1, "A100", uuid="GPU-other")], now=now) == []


def test_a_published_xids_file_another_user_planted_is_not_read(
    folder: Folder, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from gpuenv.monitoring.history import recorded_xids

    monkeypatch.setenv("GPUENV_STATE_DIR", folder.path)
    History.for_sampling(folder, 16).close()
    (tmp_path / "fake.json").write_text(
        '{"xids": [{"at": 1e12, "gpu": "x", "index": 0, "xid": 79}]}'
    )
    (Path(folder.path) / f"history-{os.getuid()}" / "xids.json").symlink_to(tmp_path / "fake.json")
    assert recorded_xids(0) == []
