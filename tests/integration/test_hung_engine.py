"""A hung engine never stalls the host (issue 33, item 3): the claims engine of the test
services is stopped (SIGSTOP: it accepts connections and answers nothing, as a stuck
dockerd does). `ps`, `top`, `doctor`, the dashboard and the exporter answer within
seconds and say the engine does not answer; a run on it fails at once with gpuenv's own
code; another user's run, on their own engine, gets a free GPU meanwhile (no engine call
is made under the host-wide claims lock). After SIGCONT everything answers again."""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import Installed, Project, _missing, gpuenv_failed
from .test_exporter import free_port, get
from .test_shared import describe

pytestmark = pytest.mark.integration

ENGINE = os.environ.get("GPUENV_TEST_DOCKER_CLAIMS", "")
RUN = Path(os.environ.get("GPUENV_TEST_RUN", "/run/gpuenv-test"))
SECONDS = 15  # what "within seconds" means here: 5 s of timeout, and a process start
QUICK = "2"  # GPUENV_ENGINE_TIMEOUT for the steps after the first, which has the default


@contextlib.contextmanager
def stopped_engine() -> Iterator[str]:
    """The claims engine, stopped, and continued after, whatever happens."""
    pidfile = RUN / "claims.pid"
    if not pidfile.exists():
        _missing(f"no pid file of the claims engine at {pidfile}")
    pid = int(pidfile.read_text().split()[0])
    os.kill(pid, signal.SIGSTOP)
    try:
        yield ENGINE
    finally:
        os.kill(pid, signal.SIGCONT)


def _timed(
    project: Project, *args: str, **env: str
) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    result = project.gpuenv(*args, **env)
    return result, time.monotonic() - started


def test_a_hung_engine_never_stalls_the_host(
    make_project, tmp_path: Path, installed_for_users: Installed
) -> None:
    # Bob's project and image are on the main test engine, which keeps answering.
    bob_project = make_project(spec="gpus: 1\n")
    bob_project.ok("build", "-q")
    bob_user = pwd.getpwnam(os.environ.get("GPUENV_TEST_USER", "gpuenv-tester"))
    host = describe(bob_project.path.parent / f"{bob_project.name}-host.json")
    os.chmod(host, 0o644)
    for root, names, files in os.walk(bob_project.path):
        for name in [".", *names, *files]:
            os.chown(os.path.join(root, name), bob_user.pw_uid, bob_user.pw_gid)
    bob_env = installed_for_users.env(
        {**bob_project.env, "HOME": bob_user.pw_dir, "GPUENV_HOST_FILE": host}
    )
    if not ENGINE:
        _missing("no engine at GPUENV_TEST_DOCKER_CLAIMS")
    alice = make_project(spec="gpus: 1\n")
    alice.env.update(DOCKER_HOST=ENGINE, GPUENV_HOST_FILE=host)
    with stopped_engine():
        ps, took = _timed(alice, "ps")
        assert ps.returncode == 10 and "does not answer" in ps.stderr, ps.stderr
        assert "nothing within 5 s" in ps.stderr and took < SECONDS, (took, ps.stderr)
        # GPUENV_ENGINE_TIMEOUT gives the engine other seconds: the other steps use it.
        alice.env["GPUENV_ENGINE_TIMEOUT"] = QUICK
        top, took = _timed(alice, "top", "--once")
        assert top.returncode == 0 and "does not answer" in top.stderr, top.stderr
        assert "A100" in top.stdout and took < SECONDS
        doctor, took = _timed(alice, "doctor")
        assert doctor.returncode == 15 and "does not answer" in doctor.stdout, doctor.stdout
        assert took < 2 * SECONDS, took
        run, took = _timed(alice, "run", "--", "true")
        assert gpuenv_failed(run, 10) and "does not answer" in run.stderr, run.stderr
        assert f"nothing within {QUICK} s" in run.stderr and took < SECONDS, (took, run.stderr)

        # Bob's run on his own engine, meanwhile, and with Alice's run waiting on hers.
        waiting = subprocess.Popen(
            [sys.executable, "-m", "gpuenv.cli", "-C", str(alice.path), "run", "--", "true"],
            env=alice.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        bobs = installed_for_users.run_as(
            bob_user,
            "-C",
            str(bob_project.path),
            "run",
            "--",
            "sh",
            "-c",
            "echo $NVIDIA_VISIBLE_DEVICES",
            env=bob_env,
            cwd=bob_project.path,
            timeout=120,
        )
        assert bobs.returncode == 0, bobs.stderr
        assert bobs.stdout.strip().startswith("GPU-")
        _, err = waiting.communicate(timeout=60)
        assert waiting.returncode == 125, err

        dashboard_port, exporter_port = free_port(), free_port()
        servers = [
            subprocess.Popen(
                [*command, "--listen", f"127.0.0.1:{port}"],
                env=alice.env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for command, port in (
                ([sys.executable, "-m", "gpuenv.cli", "dashboard"], dashboard_port),
                ([sys.executable, "-m", "gpuenv.cli", "exporter"], exporter_port),
            )
        ]
        try:
            page = _first_answer(f"http://127.0.0.1:{dashboard_port}/api/gpus")
            assert '"engine_note": "runs not shown:' in page and "does not answer" in page
            metrics = _first_answer(f"http://127.0.0.1:{exporter_port}/metrics")
            assert "gpuenv_exporter_engine_up 0.0" in metrics
        finally:
            for server in servers:
                server.send_signal(signal.SIGTERM)
                server.wait(30)
    # The engine answers again: so do the commands.
    assert alice.gpuenv("ps").returncode == 0


def _first_answer(url: str) -> str:
    """The first answer of a server that is starting (each try bounded by SECONDS)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            started = time.monotonic()
            text = get(url, timeout=SECONDS)
            assert time.monotonic() - started < SECONDS
            return text
        except OSError:
            assert time.monotonic() < deadline, f"{url} never answered"
            time.sleep(0.2)
