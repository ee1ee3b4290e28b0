from __future__ import annotations

import json
import multiprocessing
import os
import stat
import time
from pathlib import Path

import pytest

from gpuenv.common.versions import DriverVersion
from gpuenv.errors import GpusBusy
from gpuenv.host.machine import Gpu, GpuProcess, Host
from gpuenv.host.procfs import process_start
from gpuenv.reservations.claims import Claim, ClaimStore
from gpuenv.reservations.gpus import Grant, choose, parse_gpus_option
from gpuenv.reservations.reserve import reserve
from gpuenv.reservations.statedir import hold


def host(**busy: int) -> Host:
    gpus = []
    for i in range(4):
        processes = (GpuProcess(busy[f"p{i}"]),) if f"p{i}" in busy else ()
        gpus.append(
            Gpu(
                i,
                "NVIDIA A100-SXM4-80GB",
                uuid=f"GPU-{i}",
                utilization=busy.get(f"u{i}", 0),
                processes=processes,
            )
        )
    return Host(DriverVersion.parse("550.54.15"), tuple(gpus), "test")


def claim(gpu: str, pid: int | None = None) -> Claim:
    pid = pid or os.getpid()
    return Claim(
        gpu, "alice", 1000, pid, process_start(pid), os.uname().nodename, "other", time.time()
    )


@pytest.mark.parametrize(
    ("option", "state", "claims", "expected"),
    [
        ("2", {}, [], ("GPU-0", "GPU-1")),
        ("2", {"u0": 80, "u1": 5, "u2": 50, "u3": 60}, [], ("GPU-1", "GPU-2")),  # least loaded
        ("1", {"p0": 1}, [], ("GPU-1",)),  # a foreign process makes a GPU busy
        ("2", {}, ["GPU-0", "GPU-2"], ("GPU-1", "GPU-3")),
        ("1,3", {}, ["GPU-0"], ("GPU-1", "GPU-3")),
    ],
)
def test_choose(
    option: str, state: dict[str, int], claims: list[str], expected: tuple[str, ...]
) -> None:
    granted, keys = choose(parse_gpus_option(option), host(**state), [claim(g) for g in claims])
    assert granted == Grant("devices", expected)
    assert keys == list(expected)


def test_all_claims_every_gpu() -> None:
    granted, keys = choose(parse_gpus_option("all"), host(), [])
    assert granted == Grant("all") and keys == ["GPU-0", "GPU-1", "GPU-2", "GPU-3"]


@pytest.mark.parametrize(
    ("option", "state", "claims", "message"),
    [
        (
            "3",
            {},
            ["GPU-0", "GPU-1"],
            r"3 GPUs requested, 2 free on this host \(GPU 0: held by alice \(other",
        ),
        ("1", {"p0": 1, "p1": 1, "p2": 1, "p3": 1}, [], "busy with processes outside gpuenv"),
        ("1,2", {}, ["GPU-2"], "GPU 2: held by alice"),
        ("all", {}, ["GPU-3"], "GPU 3: held by alice"),
    ],
)
def test_choose_refuses(
    option: str, state: dict[str, int], claims: list[str], message: str
) -> None:
    with pytest.raises(GpusBusy, match=message) as info:
        choose(parse_gpus_option(option), host(**state), [claim(g) for g in claims])
    assert info.value.exit_code == 16


def test_store_is_private_when_made_and_dead_claims_do_not_count(tmp_path: Path) -> None:
    store = ClaimStore(str(tmp_path / "state"))
    assert stat.S_IMODE(os.stat(store.directory).st_mode) == 0o700  # never made shared
    with store.locked():
        names = store.add(["GPU-0"], "mine")
    assert [c.gpu for c in store.claims()] == ["GPU-0"]
    dead = json.loads((Path(store.directory) / names[0]).read_text())
    dead.update(pid=2**22 - 1, pid_start="1", gpu="GPU-1")
    ghost = Path(store.directory) / "claim.GPU-1.dead.json"
    ghost.write_text(json.dumps(dead))
    assert [c.gpu for c in store.claims()] == ["GPU-0"]
    assert not ghost.exists()  # ours (same uid): deleted on the way
    store.release(names)
    assert store.claims() == []


def _race(directory: str, queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    store = ClaimStore(directory)
    granted, paths = reserve(store, parse_gpus_option("1"), host(), "race", 60, lambda _: None)
    queue.put((granted.devices[0], time.monotonic()))
    time.sleep(0.3)
    store.release(paths)
    queue.put(("released", time.monotonic()))


def test_concurrent_reservations_never_overlap(tmp_path: Path) -> None:
    directory = str(tmp_path / "state")
    queue: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    workers = [multiprocessing.Process(target=_race, args=(directory, queue)) for _ in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    events = [queue.get() for _ in range(16)]
    granted = [gpu for gpu, _ in events if gpu != "released"]
    assert len(granted) == 8
    # Never more than four held at once, since there are four GPUs.
    held = 0
    for kind, _ in sorted(events, key=lambda e: e[1]):
        held += -1 if kind == "released" else 1
        assert held <= 4


def test_queue_is_first_come_first_served(tmp_path: Path) -> None:
    store = ClaimStore(str(tmp_path / "state"))
    mine = store.enqueue()
    assert store.first_in_queue(mine)
    older = Path(store.directory) / "queue.0000000001.000000.json"
    me = json.loads((Path(store.directory) / mine).read_text())
    older.write_text(json.dumps(me))
    fd = os.open(older, os.O_RDWR)
    hold(fd)  # a live waiter (this process) who came first
    try:
        assert not store.first_in_queue(mine)
    finally:
        os.close(fd)  # as if it died
    assert store.first_in_queue(mine)
    assert not older.exists()  # ours, dead: deleted


def test_runs_without_wait_do_not_jump_the_queue(tmp_path: Path) -> None:
    store = ClaimStore(str(tmp_path / "state"))
    store.enqueue()  # a live waiter (this process)
    with pytest.raises(GpusBusy, match=r"other runs are queued for GPUs on this host: \w+ \(pid"):
        reserve(store, parse_gpus_option("1"), host(), "late", None, lambda _: None)


def test_a_queued_run_wakes_when_a_claim_is_released(tmp_path: Path) -> None:
    """A waiter watches the state folder: a released claim (the folder changes) wakes
    it at once, not at its next look (issue 33, item 11). Bounded by the timeout alone
    when nothing changes."""
    import threading

    store = ClaimStore(str(tmp_path / "state"))
    with store.locked():
        names = store.add(["GPU-0"], "holder")
    releaser = threading.Timer(0.2, lambda: store.release(names))
    releaser.start()
    started = time.monotonic()
    store.wait_for_change(timeout=30)
    releaser.join()
    assert time.monotonic() - started < 30  # woken by the release, not the timeout
    started = time.monotonic()
    store.wait_for_change(timeout=0.1)  # nothing changes: the timeout ends it
    assert time.monotonic() - started >= 0.1


def test_a_detached_runs_claim_is_named_as_ps_names_the_run(tmp_path: Path) -> None:
    """Who holds a GPU, in a refusal or a queue message, is the run `gpuenv ps` lists
    (issue 31), not a container id; a name with control characters is shown escaped."""
    store = ClaimStore(str(tmp_path / "state"))
    with store.locked():
        names = store.add(["GPU-0"], "vision")
        handed = store.transfer(names, "3b9a72b27ac49d11", "train-a")
        second = store.add(["GPU-1"], "vision")
        odd = store.transfer(second, "4c0b83c38bd5", "x\x1b[2Jy")
    described = sorted(claim.describe() for claim in store.claims())
    assert any("(vision, run train-a, since" in text for text in described), described
    assert not any("\x1b" in text for text in described)
    store.release([*handed, *odd])
