"""The state folder and its files against what another local user can plant: links,
foreign or inconsistent files, stale tickets, a held lock; claims of other hosts and of
detached runs. (The same attacks as two real users: tests/integration/test_claims.py.)"""

from __future__ import annotations

import fcntl
import json
import multiprocessing
import os
import socket
import stat
import struct
import time
from pathlib import Path

import pytest

from gpuenv.errors import LockHeld, StateUnsafe
from gpuenv.reservations.claims import HEARTBEAT_EXPIRY, TICKET_EXPIRY, ClaimStore
from gpuenv.reservations.statedir import HOSTS_MARKER, LOCK_NAME, hold, open_state


def test_a_symlinked_state_folder_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    (tmp_path / "state").symlink_to(victim)
    with pytest.raises(StateUnsafe, match="is a symbolic link") as info:
        ClaimStore(str(tmp_path / "state"))
    assert info.value.exit_code == 17
    assert stat.S_IMODE(victim.stat().st_mode) == 0o700
    assert list(victim.iterdir()) == []


def test_a_symlink_above_the_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(StateUnsafe, match=r"/link is a symbolic link"):
        ClaimStore(str(tmp_path / "link" / "state"))


def test_the_lock_file_is_writable_for_all_and_a_private_one_is_refused(tmp_path: Path) -> None:
    store = ClaimStore(str(tmp_path / "state"))
    with store.locked():
        pass
    lock = Path(store.directory) / LOCK_NAME
    assert stat.S_IMODE(lock.stat().st_mode) == 0o666  # others can take the write lock
    if os.getuid() != 0:  # root opens any file for writing
        lock.chmod(0o644)
        with pytest.raises(StateUnsafe, match="not writable for all"), store.locked():
            pass


@pytest.mark.parametrize(("mode", "refused"), [(0o777, True), (0o1777, False), (0o755, False)])
def test_writable_by_others_needs_the_sticky_bit(tmp_path: Path, mode: int, refused: bool) -> None:
    folder = tmp_path / "state"
    folder.mkdir()
    folder.chmod(mode)
    if refused:
        with pytest.raises(StateUnsafe, match="not sticky"):
            ClaimStore(str(folder))
    else:
        store = ClaimStore(str(folder))
        assert store.folder.shared == bool(mode & 0o002)
    assert stat.S_IMODE(folder.stat().st_mode) == mode  # never chmod'ed


def test_a_symlinked_lock_is_refused_and_its_target_keeps_its_mode(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("private")
    secret.chmod(0o600)
    store = ClaimStore(str(tmp_path / "state"))
    (Path(store.directory) / LOCK_NAME).symlink_to(secret)
    with pytest.raises(StateUnsafe, match=r"claims\.lock is a symbolic link"), store.locked():
        pass
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600


def _hold(lock: str, ready: multiprocessing.Event, done: multiprocessing.Event) -> None:  # type: ignore[valid-type]
    fd = os.open(lock, os.O_RDWR)
    fcntl.lockf(fd, fcntl.LOCK_EX)
    ready.set()  # type: ignore[attr-defined]
    done.wait(30)  # type: ignore[attr-defined]


def test_a_held_lock_times_out_naming_its_holder(tmp_path: Path) -> None:
    store = ClaimStore(str(tmp_path / "state"), env={"GPUENV_LOCK_TIMEOUT": "0.5"})
    with store.locked():
        pass  # makes the lock file
    ready, done = multiprocessing.Event(), multiprocessing.Event()
    holder = multiprocessing.Process(
        target=_hold, args=(os.path.join(store.directory, LOCK_NAME), ready, done)
    )
    holder.start()
    try:
        assert ready.wait(10)
        began = time.monotonic()
        with (
            pytest.raises(LockHeld, match=rf"for over 0\.5s by pid {holder.pid} \(") as info,
            store.locked(),
        ):
            pass
        assert 0.5 <= time.monotonic() - began < 5
        assert info.value.exit_code == 9
    finally:
        done.set()
        holder.join(10)
    with store.locked():
        pass  # free again


def test_a_deleted_lock_file_is_made_again(tmp_path: Path) -> None:
    store = ClaimStore(str(tmp_path / "state"))
    lock = Path(store.directory) / LOCK_NAME
    with store.locked():
        lock.unlink()  # as its owner could, while others wait on the old one
    with store.locked():
        assert stat.S_ISREG(lock.lstat().st_mode)


OPEN: list[int] = []  # descriptors that keep planted records held


def _write(store: ClaimStore, name: str, data: object, *, held: bool = False) -> Path:
    """Plant a record; `held`: a live process (this one) holds it, as gpuenv does."""
    path = Path(store.directory) / name
    path.write_text(json.dumps(data))
    if held:
        fd = os.open(path, os.O_RDWR)
        hold(fd)
        OPEN.append(fd)
    return path


def _claim(store: ClaimStore, **fields: object) -> dict[str, object]:
    with store.locked():
        (name,) = store.add(["GPU-0"], "mine")
    path = Path(store.directory) / name
    data = json.loads(path.read_text())
    path.unlink()
    data.update(fields)
    return dict(data)


def test_a_claim_that_says_it_is_someone_elses_is_ignored_and_reported(tmp_path: Path) -> None:
    store = ClaimStore(str(tmp_path / "state"))
    forged = _claim(store, uid=os.getuid() + 1, user="victim")
    _write(store, "claim.GPU-0.forged.json", forged, held=True)
    assert store.claims() == []
    assert any("says it is uid" in p and "forged" in p for p in store.problems)


def test_the_owner_shown_is_the_files_not_the_json(tmp_path: Path) -> None:
    store = ClaimStore(str(tmp_path / "state"))
    _write(store, "claim.GPU-0.x.json", _claim(store, user="someone-else"), held=True)
    (claim,) = store.claims()
    assert claim.uid == os.getuid() and claim.user != "someone-else"


@pytest.mark.parametrize(
    "plant",
    [
        lambda p: p.write_text("{not json"),
        lambda p: p.write_text("[1, 2]"),
        lambda p: p.write_text(json.dumps({"uid": os.getuid(), "gpu": 3})),
        lambda p: os.mkfifo(p),
        lambda p: p.mkdir(),
        lambda p: p.write_bytes(b"{" + b" " * 70000 + b"}"),
    ],
    ids=["bad-json", "not-object", "wrong-types", "fifo", "folder", "huge"],
)
def test_malformed_files_are_ignored_and_reported(tmp_path: Path, plant) -> None:  # type: ignore[no-untyped-def]
    store = ClaimStore(str(tmp_path / "state"))
    plant(Path(store.directory) / "claim.GPU-0.bad.json")
    assert store.claims() == []
    assert len(store.problems) == 1 and "claim.GPU-0.bad.json" in store.problems[0]


def test_a_claim_nobody_holds_does_not_count_whatever_process_it_names(tmp_path: Path) -> None:
    store = ClaimStore(str(tmp_path / "state"))
    path = _write(store, "claim.GPU-0.unheld.json", _claim(store))  # names this live process
    reader = os.open(path, os.O_RDONLY)
    try:
        fcntl.fcntl(reader, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_RDLCK, 0, 0, 0, 0))
        assert store.claims() == []  # a read lock (anyone can take one) is no holder
    finally:
        os.close(reader)


def test_claims_of_other_hosts_count_only_where_shared_and_fresh(tmp_path: Path) -> None:
    now = [time.time()]
    store = ClaimStore(str(tmp_path / "state"), clock=lambda: now[0])
    _write(store, "claim.GPU-0.far.json", _claim(store, host="elsewhere", pid=1))
    assert store.claims() == []  # not marked shared between hosts
    (Path(store.directory) / HOSTS_MARKER).write_text("")
    store = ClaimStore(str(tmp_path / "state"), clock=lambda: now[0])
    assert [c.host for c in store.claims()] == ["elsewhere"]
    now[0] += HEARTBEAT_EXPIRY + 1  # no heartbeat since
    assert store.claims() == []
    store.touch(["claim.GPU-0.far.json"])  # its run's heartbeat
    now[0] = time.time()
    assert [c.host for c in store.claims()] == ["elsewhere"]


def test_a_ticket_nobody_refreshes_goes_stale(tmp_path: Path) -> None:
    now = [time.time()]
    store = ClaimStore(str(tmp_path / "state"), clock=lambda: now[0])
    ticket = store.enqueue()
    assert [w.pid for w in store.waiting()] == [os.getpid()]
    now[0] += TICKET_EXPIRY + 1
    assert store.waiting() == []
    assert not (Path(store.directory) / ticket).exists()  # ours: deleted


def test_a_forged_ticket_does_not_hold_the_queue(tmp_path: Path) -> None:
    store = ClaimStore(str(tmp_path / "state"))
    me = {
        "user": "victim",
        "uid": os.getuid() + 1,
        "pid": os.getpid(),
        "host": socket.gethostname(),
    }
    _write(store, "queue.0000000001.000000.forged.json", {**me, "pid_start": "1"})
    assert store.waiting() == []
    assert any("says it is uid" in p for p in store.problems)


def test_a_detached_runs_claim_lives_with_its_keeper(tmp_path: Path) -> None:
    """A detached run's claims name its container and count while a process holds their
    locks: its keeper, which inherited the descriptors (here, a copy in this process).
    No engine is asked (issue 33, item 1): another user's engine could not answer."""
    store = ClaimStore(str(tmp_path / "state"))
    with store.locked():
        names = store.add(["GPU-0", "GPU-1"], "mine")
        handed = store.transfer(names, "c1")
    kept = [os.dup(fd) for fd in store.held_descriptors(handed)]  # the keeper's copies
    store.forget(handed)  # `gpuenv run -d` exits
    (claim, _) = store.claims()
    assert claim.container == "c1" and claim.pid == 0
    assert "container c1" in claim.describe()
    for fd in kept:  # the keeper ends (its container did, or it was killed)
        os.close(fd)
    assert store.claims() == []
    assert not any((Path(store.directory) / n).exists() for n in handed + names)


def test_the_shared_default_needs_an_admin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gpuenv.reservations.statedir.SHARED_STATE_DIR", str(tmp_path / "absent"))
    monkeypatch.setattr(
        "gpuenv.reservations.statedir.user_state_dir", lambda: str(tmp_path / "mine")
    )
    folder = open_state({})
    assert folder.path == str(tmp_path / "mine") and not folder.shared and folder.note == ""
    unsafe = tmp_path / "absent"
    unsafe.mkdir()
    unsafe.chmod(0o777)
    folder = open_state({})
    assert folder.path == str(tmp_path / "mine") and "not sticky" in folder.note
    unsafe.chmod(0o1777)
    assert open_state({}).path == str(unsafe)
