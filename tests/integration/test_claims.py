"""Claims on a shared server as two unprivileged users against the real engine: each
attack another local user can make on the state folder is refused or harmless, and a
detached run holds its GPU for its container, with no gpuenv process alive.

Alice (GPUENV_TEST_USER) is the victim, Mallory (GPUENV_TEST_USER2) the other user. The
shared folder is made as the docs say an admin makes it: root-owned, mode 1777."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import Installed, Project, _missing, clear_leftovers, gpuenv_failed
from .conftest import docker as docker_cli
from .test_engines import _Forward, _Server
from .test_shared import UUIDS, describe

pytestmark = pytest.mark.integration


@dataclass
class User:
    account: pwd.struct_passwd
    project: Project
    installed: Installed
    env: dict[str, str]

    @property
    def name(self) -> str:
        return self.account.pw_name

    def argv(self, *args: str) -> list[str]:
        return self.installed.as_user(self.account, *args)

    def environment(self, **extra: str) -> dict[str, str]:
        return self.installed.env({**self.env, **extra})

    def gpuenv(self, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*self.installed.argv("-C", str(self.project.path), *args)),
            capture_output=True,
            text=True,
            env=self.environment(**extra),
            timeout=300,
        )

    def popen(self, *argv: str, **extra: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv(*argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.environment(**extra),
        )

    def python(self, code: str) -> subprocess.Popen[str]:
        """A Python process of this user (its stdout is a pipe the test reads)."""
        return self.popen(self.installed.python, "-c", code)


@dataclass
class Server:
    alice: User
    mallory: User
    state: Path  # the shared folder, as an admin made it
    base: Path  # a world-traversable folder for what the test plants


ENGINE = os.environ.get("GPUENV_TEST_DOCKER_CLAIMS", "")


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """The docker CLI on these tests' own engine (scripts/services.sh: 'claims')."""
    return docker_cli(*args, host=ENGINE, check=check)


@pytest.fixture(scope="module")
def engine(docker_host: str) -> str:
    if not ENGINE or docker("version", check=False).returncode:
        _missing(f"no engine for the shared-server tests at GPUENV_TEST_DOCKER_CLAIMS={ENGINE!r}")
    clear_leftovers(ENGINE)
    return ENGINE


@pytest.fixture
def server(make_project, installed_for_users: Installed, engine: str) -> Iterator[Server]:
    if os.getuid() != 0:
        pytest.skip("needs root to act as two users")
    project = make_project(spec="gpus: 1\n")
    project.env["DOCKER_HOST"] = engine
    project.ok("build", "-q")
    base = project.path.parent
    state = base / "shared-state"
    subprocess.run(["install", "-d", "-m", "1777", "-o", "root", str(state)], check=True)
    host_file = describe(base / "host.json")
    os.chmod(host_file, 0o644)
    users = []
    for variable, default in (
        ("GPUENV_TEST_USER", "gpuenv-tester"),
        ("GPUENV_TEST_USER2", "gpuenv-tester2"),
    ):
        account = pwd.getpwnam(os.environ.get(variable, default))
        cache, data = base / f".cache-{account.pw_name}", base / f".data-{account.pw_name}"
        for folder in (cache, data):
            folder.mkdir(exist_ok=True)
            os.chown(folder, account.pw_uid, account.pw_gid)
        env = {
            **project.env,
            "HOME": account.pw_dir,
            "USER": account.pw_name,
            "XDG_CACHE_HOME": str(cache),
            "GPUENV_DATA_DIR": str(data),
            "GPUENV_STATE_DIR": str(state),
            "GPUENV_HOST_FILE": host_file,
        }
        users.append(User(account, project, installed_for_users, env))
    yield Server(users[0], users[1], state, base)
    label = f"label=io.gpuenv.project={project.name}"
    left = docker("ps", "-aq", "--filter", label).stdout.split()
    if left:
        docker("rm", "-f", *left, check=False)
    images = docker("images", "-q", f"gpuenv/{project.name}").stdout.split()
    if images:
        docker("rmi", "-f", *set(images), check=False)


def _chown(path: Path, user: User) -> None:
    os.chown(path, user.account.pw_uid, user.account.pw_gid, follow_symlinks=False)


def _sleeper(user: User) -> tuple[subprocess.Popen[str], str]:
    """A live process of `user`, and its start time (what a forged record would name)."""
    process = user.popen("sleep", "300")
    for _ in range(100):
        try:
            with open(f"/proc/{process.pid}/comm") as handle:
                if handle.read().strip() == "sleep":
                    with open(f"/proc/{process.pid}/stat") as stat:
                        return process, stat.read().rsplit(")", 1)[1].split()[19]
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError("the sleeper did not start")


def test_a_symlinked_state_folder_is_refused(server: Server) -> None:
    alice, mallory = server.alice, server.mallory
    victim = server.base / "alice-private"
    victim.mkdir(mode=0o700)
    _chown(victim, alice)
    public = server.base / "public"
    public.mkdir()
    public.chmod(0o1777)
    link = public / "gpuenv"
    link.symlink_to(victim)  # planted by Mallory where Alice's state folder would be
    _chown(link, mallory)
    refused = alice.gpuenv("run", "--gpus", "1", "--", "true", GPUENV_STATE_DIR=str(link))
    assert gpuenv_failed(refused, 17), refused.stderr
    assert f"{link} is a symbolic link (owned by {mallory.name})" in refused.stderr
    assert "install -d -m 1777 -o root" in refused.stderr or "remove it" in refused.stderr
    assert (victim.stat().st_mode & 0o7777) == 0o700 and list(victim.iterdir()) == []


def test_a_symlinked_lock_is_refused_and_its_target_untouched(server: Server) -> None:
    alice, mallory = server.alice, server.mallory
    secret = Path(alice.account.pw_dir) / "gpuenv-itest-secret"
    secret.write_text("alice's")
    _chown(secret, alice)
    secret.chmod(0o600)
    try:
        lock = server.state / "claims.lock"
        lock.symlink_to(secret)
        _chown(lock, mallory)
        refused = alice.gpuenv("run", "--gpus", "1", "--", "true")
        assert gpuenv_failed(refused, 17), refused.stderr
        assert f"claims.lock is a symbolic link (owned by {mallory.name})" in refused.stderr
        assert (secret.stat().st_mode & 0o7777) == 0o600
        assert secret.stat().st_uid == alice.account.pw_uid
    finally:
        secret.unlink()


# Mallory's process plants records in the shared folder and holds them (a write lock,
# as a live gpuenv does), refreshing their mtime: only what they say gives them away.
PLANT = """
import fcntl, json, os, struct, sys, time
records = json.loads(sys.argv[1])
fds = []
for name, (record, held, age) in records.items():
    fd = os.open(os.path.join(sys.argv[2], name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, json.dumps(record).encode())
    if held:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 0, 0))
    os.utime(fd, (time.time() - age, time.time() - age))
    fds.append((fd, age))
print("planted", flush=True)
while True:
    for fd, age in fds:
        if not age:
            os.utime(fd)
    time.sleep(0.5)
"""


@contextlib.contextmanager
def _plant(
    server: Server, records: dict[str, tuple[dict[str, object], bool, float]]
) -> Iterator[None]:
    """Records (record, held, age in seconds: 0 keeps it fresh) planted by Mallory."""
    process = server.mallory.popen(
        server.mallory.installed.python, "-c", PLANT, json.dumps(records), str(server.state)
    )
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "planted"
        yield
    finally:
        process.kill()
        process.wait()


def test_a_forged_claim_is_ignored_and_reported(server: Server) -> None:
    alice, mallory = server.alice, server.mallory
    sleeper, start = _sleeper(alice)
    record = {
        "gpu": UUIDS[0],
        "user": alice.name,
        "uid": alice.account.pw_uid,  # Mallory's file, saying it is Alice's
        "pid": sleeper.pid,
        "pid_start": start,
        "host": socket.gethostname(),
        "project": "forged",
        "since": time.time(),
    }
    # Mallory's own uid, naming Alice's live process, but no process holds it.
    borrowed = {**record, "uid": mallory.account.pw_uid, "gpu": UUIDS[1]}
    planted = {
        "claim.forged.json": (record, True, 0.0),
        "claim.borrowed.json": (borrowed, False, 0.0),
    }
    try:
        with _plant(server, planted):
            top = json.loads(alice.gpuenv("top", "--once", "--json").stdout)
            assert [g["claimed_by"] for g in top["gpus"]] == [None] * 4
            ran = alice.gpuenv(
                "run", "--gpus", "0,1", "--", "sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES"
            )
            assert ran.returncode == 0, ran.stderr
            assert ran.stdout.strip() == f"{UUIDS[0]},{UUIDS[1]}"
            doctor = json.loads(alice.gpuenv("doctor", "--json").stdout)
            problems = [c["detail"] for c in doctor if c["name"] == "state file"]
            assert any(
                "claim.forged.json" in p
                and f"owned by {mallory.name}" in p
                and "says it is uid" in p
                for p in problems
            ), problems
            assert (server.state / "claim.forged.json").exists()  # Alice cannot delete it
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_forged_queue_ticket_does_not_stop_runs(server: Server) -> None:
    alice, mallory = server.alice, server.mallory
    me = {"host": socket.gethostname(), "since": 1.0, "pid_start": "1"}
    tickets = {
        # says it is Alice's, held and kept fresh: but it is Mallory's file
        "queue.0000000001.000000.a.json": (
            {**me, "user": alice.name, "uid": alice.account.pw_uid, "pid": 1},
            True,
            0.0,
        ),
        # Mallory's own, held, but not refreshed as a waiting gpuenv does
        "queue.0000000002.000000.b.json": (
            {**me, "user": mallory.name, "uid": mallory.account.pw_uid, "pid": 1},
            True,
            3600.0,
        ),
        # Mallory's own and fresh, but no process holds it
        "queue.0000000003.000000.c.json": (
            {**me, "user": mallory.name, "uid": mallory.account.pw_uid, "pid": 1},
            False,
            0.0,
        ),
    }
    with _plant(server, tickets):
        ran = alice.gpuenv("run", "--gpus", "1", "--", "true")
        assert ran.returncode == 0, ran.stderr
        assert "queued" not in ran.stderr
    # A real waiter of Mallory's does hold the queue, and is named.
    busy_until = alice.popen(
        *alice.installed.argv(
            "-C", str(alice.project.path), "run", "--gpus", "all", "--", "sleep", "8"
        )
    )
    try:
        _until(lambda: len(list(server.state.glob("claim.*.json"))) >= 4, "Alice holds every GPU")
        tickets = set(server.state.glob("queue.*.json"))  # the forged ones above, if left
        waiter = mallory.popen(
            *mallory.installed.argv(
                "-C", str(mallory.project.path), "run", "--gpus", "1", "--wait", "--", "true"
            )
        )
        _until(lambda: set(server.state.glob("queue.*.json")) - tickets, "Mallory is queued")
        refused = alice.gpuenv("run", "--gpus", "1", "--", "true")
        assert gpuenv_failed(refused, 16)
        assert f"other runs are queued for GPUs on this host: {mallory.name} (pid" in refused.stderr
        assert waiter.wait(timeout=120) == 0
    finally:
        busy_until.kill()
        busy_until.wait()


def test_a_held_lock_times_out_naming_its_holder(server: Server) -> None:
    alice, mallory = server.alice, server.mallory
    lock = server.state / "claims.lock"
    assert alice.gpuenv("run", "--gpus", "1", "--", "true").returncode == 0  # makes the lock
    # A flock on it is not gpuenv's lock: harmless.
    flock = mallory.python(
        "import fcntl, os, time\n"
        f"fd = os.open({str(lock)!r}, os.O_RDONLY)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\n"
        "time.sleep(300)\n"
    )
    try:
        assert flock.stdout is not None and flock.stdout.readline().strip() == "held"
        ran = alice.gpuenv("run", "--gpus", "1", "--", "true", GPUENV_LOCK_TIMEOUT="2")
        assert ran.returncode == 0, ran.stderr
    finally:
        flock.kill()
        flock.wait()
    holder = mallory.python(
        "import fcntl, os, time\n"
        f"fd = os.open({str(lock)!r}, os.O_RDWR)\n"
        "fcntl.lockf(fd, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\n"
        "time.sleep(300)\n"
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        began = time.monotonic()
        refused = alice.gpuenv("run", "--gpus", "1", "--", "true", GPUENV_LOCK_TIMEOUT="2")
        assert gpuenv_failed(refused, 9), refused.stderr
        assert f"locked for over 2s by pid {holder.pid} (" in refused.stderr
        # Its user and command where /proc lets Alice see them (not on hardened hosts).
        visible = subprocess.run(alice.argv("test", "-r", f"/proc/{holder.pid}/status")).returncode
        if visible == 0:
            assert f"by pid {holder.pid} ({mallory.name}: " in refused.stderr
        else:
            assert "its user and command are not visible here" in refused.stderr
        assert "GPUENV_LOCK_TIMEOUT" in refused.stderr
        assert time.monotonic() - began < 60
    finally:
        holder.kill()
        holder.wait()
    assert alice.gpuenv("run", "--gpus", "1", "--", "true").returncode == 0  # free again


def _state(container: str) -> str:
    return docker("inspect", "-f", "{{.State.Status}}", container, check=False).stdout.strip()


def test_a_detached_run_outlives_its_shell_and_holds_its_gpu(server: Server) -> None:
    alice, mallory = server.alice, server.mallory
    name = f"{alice.project.name}-detached"
    command = "echo started; sleep 12; echo done; exit 3"
    # Started from a shell in a session of its own, which then ends.
    gpuenv = " ".join(alice.installed.argv("-C", str(alice.project.path)))
    shell = subprocess.run(
        alice.argv(
            "setsid",
            "bash",
            "-c",
            f"{gpuenv} run -d --name {name} --gpus device=1 -- sh -c '{command}'; echo rc=$?",
        ),
        capture_output=True,
        text=True,
        env=alice.environment(),
        timeout=120,
    )
    assert shell.stdout.split() == [name, "rc=0"], shell.stderr
    container = docker("inspect", "-f", "{{.Id}}", name).stdout.strip()
    try:
        assert _state(container) == "running"
        # Another user's run cannot take its GPU; a run of theirs reaps orphans, not it.
        busy = mallory.gpuenv("run", "--gpus", "device=1", "--", "true")
        assert gpuenv_failed(busy, 16), busy.stderr
        assert f"GPU 1: held by {alice.name}" in busy.stderr and f"run {name}" in busy.stderr
        assert mallory.gpuenv("run", "--gpus", "none", "--", "true").returncode == 0
        assert _state(container) == "running"
        (run,) = [r for r in json.loads(alice.gpuenv("ps", "--json").stdout) if r["name"] == name]
        assert run["detached"] is True and run["state"] == "running"
        assert run["gpus"] == UUIDS[1]
        table = alice.gpuenv("ps", COLUMNS="250").stdout
        assert "running, detached" in table
        # logs -f streams while it runs (then Ctrl-C stops following, not the run).
        follow = alice.popen(*alice.installed.argv("logs", "-f", name))
        assert follow.stdout is not None and follow.stdout.readline().strip() == "started"
        assert _state(container) == "running"
        follow.send_signal(signal.SIGINT)
        assert follow.wait(timeout=30) == 0
        assert mallory.gpuenv("logs", name).returncode == 2  # not Mallory's to read
        # The command ends with no gpuenv process alive: the GPU is free for Mallory.
        docker("wait", container)
        ran = mallory.gpuenv(
            "run", "--gpus", "device=1", "--", "sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES"
        )
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.strip() == UUIDS[1]
        waited = alice.gpuenv("wait", name)
        assert waited.returncode == 3  # the command's exit code
        logs = alice.gpuenv("logs", name)
        assert logs.stdout.split() == ["started", "done"]
        assert alice.gpuenv("rm", name).returncode == 0
        assert _state(container) == ""
    finally:
        docker("rm", "-f", container, check=False)


def test_a_detached_run_stopped_frees_its_gpu(server: Server) -> None:
    alice, mallory = server.alice, server.mallory
    ticking = "while :; do echo tick; sleep 0.2; done"
    started = alice.gpuenv("run", "-d", "--gpus", "device=2", "--", "sh", "-c", ticking)
    assert started.returncode == 0, started.stderr
    name = started.stdout.strip()
    try:
        attached = alice.popen(*alice.installed.argv("attach", name))
        assert attached.stdout is not None
        assert attached.stdout.readline() == "tick\n"  # it follows the run now
        assert mallory.gpuenv("stop", name).returncode == 2  # not Mallory's
        assert alice.gpuenv("stop", name).returncode == 0
        assert attached.wait(timeout=60) in (143, 137)  # attach passes the code back
        assert mallory.gpuenv("run", "--gpus", "device=2", "--", "true").returncode == 0
    finally:
        docker("rm", "-f", name, check=False)


@pytest.mark.parametrize("through", ["unix", "tcp"])
def test_detached_run_logs_wait_and_rm(server: Server, engine: str, through: str) -> None:
    """Both transports of the one adapter (unix:// and tcp://): create with a name,
    logs with stdout and stderr apart, wait, rm."""
    project = server.alice.project  # run as root here
    if through == "tcp":
        forwarder = _Server(("127.0.0.1", 0), type("F", (_Forward,), {"unix_path": engine[7:]}))
        threading.Thread(target=forwarder.serve_forever, daemon=True).start()
        engine = f"tcp://127.0.0.1:{forwarder.server_address[1]}"
    name = f"{project.name}-{through}"
    script = "echo out; echo err >&2; sleep 2; echo late; exit 4"
    started = project.ok("run", "-d", "--name", name, "--", "sh", "-c", script, DOCKER_HOST=engine)
    assert started.stdout.strip() == name
    followed = project.ok("logs", "-f", name, DOCKER_HOST=engine)
    assert followed.stdout == "out\nlate\n" and followed.stderr == "err\n"
    assert project.gpuenv("wait", name, DOCKER_HOST=engine).returncode == 4
    tail = project.ok("logs", "--tail", "1", name, DOCKER_HOST=engine)
    assert tail.stdout == "late\n"
    (run,) = json.loads(project.ok("ps", "--all", "--json", DOCKER_HOST=engine).stdout)
    assert run["name"] == name and run["detached"] is True and run["state"] == "exited"
    assert gpuenv_failed(project.gpuenv("attach", name, DOCKER_HOST=engine), 2)  # not running
    project.ok("rm", name, DOCKER_HOST=engine)
    assert json.loads(project.ok("ps", "--all", "--json", DOCKER_HOST=engine).stdout) == []


def _until(condition: Callable[[], object], what: str, seconds: float = 60) -> None:
    """Wait until `condition` holds (polled), failing with `what` after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.1)


def test_ended_runs_as_docker_users_expect(server: Server, engine: str) -> None:
    """`ps -a` lists ended runs; `rm` takes several, says what it cannot remove and goes
    on; `stop` of an ended run says so; a name in use names the `gpuenv rm` fix; a name
    the engine would refuse is a usage error (exit 2) before anything starts."""
    project = server.alice.project
    first, second = f"{project.name}-a", f"{project.name}-b"
    try:
        for name in (first, second):
            project.ok("run", "-d", "--name", name, "--", "true", DOCKER_HOST=engine)
            assert project.gpuenv("wait", name, DOCKER_HOST=engine).returncode == 0
        listed = json.loads(project.ok("ps", "-a", "--json", DOCKER_HOST=engine).stdout)
        assert {run["name"] for run in listed} == {first, second}
        stopped = project.gpuenv("stop", first, DOCKER_HOST=engine)
        assert f"{first} has already ended" in " ".join(stopped.stderr.split()), stopped.stderr
        taken = project.gpuenv("run", "-d", "--name", first, "--", "true", DOCKER_HOST=engine)
        said = " ".join(taken.stderr.split())
        assert gpuenv_failed(taken, 10) and f"gpuenv rm {first}" in said, said
        bad = project.gpuenv("run", "-d", "--name", "no/slashes", "--", "true", DOCKER_HOST=engine)
        assert gpuenv_failed(bad, 2) and "--name" in bad.stderr, bad.stderr
        removed = project.gpuenv("rm", first, "nosuchrun", second, DOCKER_HOST=engine)
        assert removed.returncode != 0
        assert f"removed {first}" in removed.stderr and f"removed {second}" in removed.stderr
        assert "nosuchrun" in removed.stderr
        assert json.loads(project.ok("ps", "-a", "--json", DOCKER_HOST=engine).stdout) == []
    finally:
        docker("rm", "-f", first, second, check=False)
