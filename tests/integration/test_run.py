"""`gpuenv run` against a real Docker engine: with the stand-in NVIDIA hook (GPU requests
reach the daemon's nvidia driver) and without it (a host lacking the toolkit)."""

from __future__ import annotations

import grp
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from .conftest import GPUENV, Installed, Project, containers, docker, gpuenv_failed

pytestmark = pytest.mark.integration

UUIDS = [f"GPU-{i}{i}{i}{i}{i}{i}{i}{i}-0000-4000-8000-00000000000{i}" for i in range(4)]


@pytest.fixture
def project(make_project) -> Project:
    made = make_project(spec="gpus: all\nshm_size: 256m\nenv: {FROM_SPEC: spec-value}\n")
    made.ok("build", "-q")
    return made


def host_file(
    tmp_path: Path, driver: str = "550.54.15", name: str = "NVIDIA A100-SXM4-80GB", count: int = 4
) -> str:
    path = tmp_path / "host.json"
    gpus = [{"index": i, "name": name, "uuid": UUIDS[i]} for i in range(count)]
    path.write_text(json.dumps({"driver": driver, "gpus": gpus}))
    return str(path)


def visible_devices(result: subprocess.CompletedProcess[str]) -> str:
    lines = [
        line for line in result.stdout.splitlines() if line.startswith("NVIDIA_VISIBLE_DEVICES=")
    ]
    assert len(lines) == 1, result.stdout + result.stderr
    return lines[0].split("=", 1)[1]


def test_exit_code_is_the_commands(project: Project) -> None:
    assert project.gpuenv("run", "--", "sh", "-c", "exit 3").returncode == 3
    assert project.gpuenv("run", "--", "true").returncode == 0
    # gpuenv's own codes stay apart from the command's (issue 33, item 4): pytest's 5 is 5,
    # a missing command 127 and one that cannot be executed 126, as with docker run.
    assert project.gpuenv("run", "--", "sh", "-c", "exit 5").returncode == 5
    missing = project.gpuenv("run", "--", "no-such-command-here")
    assert missing.returncode == 127, missing.stderr
    assert "no-such-command-here" in missing.stderr
    denied = project.gpuenv("run", "--", "/etc/hostname")
    assert denied.returncode == 126, denied.stderr


def test_python_target_and_arguments(project: Project) -> None:
    project.write("show.py", "import sys\nprint('args:', sys.argv[1:])\n")
    result = project.ok("run", "show.py", "--lr", "3e-4", "-x")
    assert "args: ['--lr', '3e-4', '-x']" in result.stdout


def test_output_streams_and_stdin(project: Project) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuenv.cli",
            "-C",
            str(project.path),
            "run",
            "--",
            "sh",
            "-c",
            "cat; echo err >&2",
        ],
        input="from stdin\n",
        capture_output=True,
        text=True,
        env=project.env,
        timeout=120,
    )
    assert result.returncode == 0
    assert result.stdout == "from stdin\n"
    assert "err" in result.stderr


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        ("1,3", f"{UUIDS[1]},{UUIDS[3]}"),
        ("device=2", UUIDS[2]),
        ("2", f"{UUIDS[0]},{UUIDS[1]}"),
        ("all", "all"),
        (f"{UUIDS[3]}", UUIDS[3]),
        ("none", "void"),
    ],
)
def test_gpu_grants_by_uuid(project: Project, tmp_path: Path, option: str, expected: str) -> None:
    result = project.ok(
        "run",
        "--gpus",
        option,
        "--",
        "sh",
        "-c",
        "env | grep -E '^(NVIDIA_VISIBLE_DEVICES|CUDA_DEVICE_ORDER)='",
        GPUENV_HOST_FILE=host_file(tmp_path),
    )
    # The stand-in image bakes NVIDIA_VISIBLE_DEVICES=all, like NGC's: the grant wins.
    assert visible_devices(result) == expected
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in result.stdout


def test_gpu_grants_by_index_when_gpus_are_unknown(project: Project, tmp_path: Path) -> None:
    path = tmp_path / "host.json"
    path.write_text('{"driver": null, "gpus": []}')
    result = project.ok("run", "--gpus", "0,2", "--", "env", GPUENV_HOST_FILE=str(path))
    assert visible_devices(result) == "0,2"


def test_gpu_that_does_not_exist(project: Project, tmp_path: Path) -> None:
    result = project.gpuenv(
        "run", "--gpus", "7", "--", "true", GPUENV_HOST_FILE=host_file(tmp_path)
    )
    assert gpuenv_failed(result, 2)
    assert "7 GPUs requested, but this host has 4" in result.stderr


def test_without_the_nvidia_runtime(project: Project) -> None:
    nogpu = os.environ["GPUENV_TEST_DOCKER_NOGPU"]
    project.ok("build", "-q", DOCKER_HOST=nogpu)
    try:
        before = containers(nogpu, project.name)
        optional = project.ok("run", "--gpus", "optional", "--", "echo", "ran", DOCKER_HOST=nogpu)
        assert optional.stdout.strip() == "ran"
        assert "no NVIDIA runtime in this Docker engine: running without GPUs" in optional.stderr
        required = project.gpuenv("run", "--gpus", "all", "--", "echo", "ran", DOCKER_HOST=nogpu)
        assert gpuenv_failed(required, 13)
        assert "NVIDIA Container Toolkit is missing" in required.stderr
        assert 'could not select device driver "" with capabilities: [[gpu]]' in required.stderr
        assert "Traceback" not in required.stderr
        assert containers(nogpu, project.name) == before
    finally:
        listed = docker("images", "-q", f"gpuenv/{project.name}", host=nogpu).stdout.split()
        if listed:
            docker("rmi", "-f", *set(listed), host=nogpu, check=False)


def test_old_driver_is_refused_before_starting(project: Project, tmp_path: Path) -> None:
    old = host_file(tmp_path, driver="535.104.05", name="NVIDIA GeForce RTX 4090", count=1)
    before = containers(project=project.name)
    result = project.gpuenv("run", "--", "true", GPUENV_HOST_FILE=old)
    assert gpuenv_failed(result, 4)
    assert "this host cannot run the locked image nvcr.io/nvidia/pytorch:24.06-py3" in result.stderr
    assert "needs driver ≥ 545 (this host has 535.104.05)" in result.stderr
    assert "--force" in result.stderr
    assert containers(project=project.name) == before
    assert project.gpuenv("run", "--force", "--", "true", GPUENV_HOST_FILE=old).returncode == 0


def test_runs_as_the_invoking_user(project: Project, installed_for_users: Installed) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to act as another user")
    uid = 4242
    docker_gid = grp.getgrnam("docker").gr_gid
    os.chown(project.path, uid, uid)
    argv = installed_for_users.argv(
        "-C",
        str(project.path),
        "run",
        "--",
        "sh",
        "-c",
        "touch written.txt && mkdir -p out && id -un && echo $HOME && touch $HOME/ok && pwd",
    )
    result = subprocess.run(
        installed_for_users.as_user(uid, *argv, groups=[docker_gid]),
        capture_output=True,
        text=True,
        timeout=120,
        env=installed_for_users.env(
            {
                **project.env,
                "USER": "alice",
                "HOME": "/tmp",
                "XDG_CACHE_HOME": "/tmp/gpuenv-test-cache-4242",
            }
        ),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["alice", "/home/alice", "/workspace"]
    for name in ("written.txt", "out"):
        info = (project.path / name).stat()
        assert (info.st_uid, info.st_gid) == (uid, uid)


def test_root_opt_out(project: Project) -> None:
    assert project.ok("run", "--root", "--", "id", "-u").stdout.strip() == "0"


def test_environment(project: Project, tmp_path: Path) -> None:
    env_file = tmp_path / "vars.env"
    env_file.write_text("# comment\nFROM_FILE=file-value\nFROM_SPEC=overridden-by-file\n")
    result = project.ok(
        "run",
        "-e",
        "FROM_FLAG=flag-value",
        "-e",
        "SECRET_TOKEN",
        "--env-file",
        str(env_file),
        "--",
        "sh",
        "-c",
        "echo $FROM_SPEC $FROM_FILE $FROM_FLAG $SECRET_TOKEN",
        SECRET_TOKEN="s3cr3t-host-value",
    )
    assert result.stdout.split() == [
        "overridden-by-file",
        "file-value",
        "flag-value",
        "s3cr3t-host-value",
    ]
    assert "s3cr3t-host-value" not in result.stderr


def test_training_defaults(project: Project) -> None:
    result = project.ok(
        "run",
        "--",
        "sh",
        "-c",
        "df -k /dev/shm | tail -1; ulimit -s; cat /proc/1/cmdline | tr '\\0' ' '",
    )
    lines = result.stdout.splitlines()
    assert lines[0].split()[1] == str(256 * 1024)  # shm_size: 256m, in KiB
    assert lines[1] == "65536"  # stack: 64 MiB, in KiB
    assert "init" in lines[2]  # an init process is PID 1


def test_out_of_memory_is_reported(project: Project) -> None:
    result = project.gpuenv(
        "run", "--memory", "64m", "--", "python3", "-c", "x = bytearray(400 * 1024 * 1024)"
    )
    assert result.returncode == 137
    assert "ran out of memory (OOM)" in result.stderr


def test_a_spec_edit_stops_the_run(project: Project) -> None:
    assert project.gpuenv("run", "--", "true").returncode == 0  # the build stamp is fresh
    path = project.path / "gpuenv.yaml"
    path.write_text(path.read_text() + "apt: [git]\n")
    result = project.gpuenv("run", "--", "true")
    assert gpuenv_failed(result, 5)
    assert "run `gpuenv lock`" in result.stderr


def test_a_requirements_edit_locks_again_unless_locked(project: Project) -> None:
    """As `uv run`: the run locks the Python packages again (and says so); --locked
    refuses (exit 5); --frozen runs the lock as it is."""
    assert project.gpuenv("run", "--", "true").returncode == 0
    path = project.path / "requirements.txt"
    path.write_text("--no-index\n--find-links /opt/wheelhouse\nsix\n")  # the stand-in's
    refused = project.gpuenv("run", "--locked", "--", "true")
    assert gpuenv_failed(refused, 5)
    assert "requirements.txt changed since the Python packages were locked" in refused.stderr
    frozen = project.gpuenv("run", "--frozen", "--", "python3", "-c", "import six")
    assert frozen.returncode == 1  # the lock as it was: six is not in it
    ran = project.gpuenv("run", "--", "python3", "-c", "import six")
    assert ran.returncode == 0, ran.stderr
    assert "the Python packages are resolved again" in ran.stderr and "+ six" in ran.stderr


def _running(project: Project, timeout: float = 60) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = docker(
            "ps", "-q", "--filter", f"label=io.gpuenv.project={project.name}"
        ).stdout.split()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError("the run's container never appeared")


def _start(project: Project, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpuenv.cli", "-C", str(project.path), "run", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=project.env,
    )


def test_ctrl_c_stops_and_removes(project: Project) -> None:
    process = _start(project, "--", "sleep", "300")
    (container,) = _running(project)
    labels = json.loads(docker("inspect", container).stdout)[0]["Config"]["Labels"]
    assert labels["io.gpuenv.project"] == project.name
    assert labels["io.gpuenv.gpus"] == "all"
    assert labels["io.gpuenv.pid"] == str(process.pid)
    assert labels["io.gpuenv.started"].endswith("Z") and labels["io.gpuenv.lock"].startswith(
        "sha256:"
    )
    started = time.monotonic()
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert time.monotonic() - started < 10
    assert process.returncode == 130
    assert "stopping the container" in stderr
    assert docker("ps", "-aq", "--filter", f"id={container}").stdout.strip() == ""


def test_second_ctrl_c_kills(project: Project) -> None:
    process = _start(project, "--", "sh", "-c", "trap '' INT; sleep 300")
    _running(project)
    process.send_signal(signal.SIGINT)
    assert process.stderr is not None
    for line in process.stderr:  # gpuenv says it is stopping the container, then waits
        if "Ctrl-C again to kill it" in line:
            break
    assert process.poll() is None  # the command ignores SIGINT
    process.send_signal(signal.SIGINT)
    process.communicate(timeout=30)
    assert process.returncode == 137


def test_killed_gpuenv_leaves_an_orphan_the_next_run_removes(project: Project) -> None:
    process = _start(project, "--", "sleep", "300")
    (container,) = _running(project)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=10)
    # gpuenv is gone, its container is not.
    assert docker("ps", "-q", "--filter", f"id={container}").stdout.strip() != ""
    result = project.ok("run", "--", "true")
    assert "left behind by a gpuenv run that was killed" in result.stderr
    assert docker("ps", "-aq", "--filter", f"id={container}").stdout.strip() == ""


def _in_terminal(
    project: Project, args: list[str], typed: bytes, timeout: float = 120
) -> tuple[int, bytes]:
    """Run gpuenv with a pseudo-terminal as its stdin and stdout, typing `typed`."""
    import pty

    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuenv.cli", "-C", str(project.path), *args],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        env=project.env,
        close_fds=True,
    )
    os.close(terminal)
    output = b""
    deadline = time.monotonic() + timeout
    sent = False
    while time.monotonic() < deadline:
        try:
            chunk = os.read(controller, 4096)
        except OSError:
            break
        output += chunk
        if not sent and (b"$ " in output or b"# " in output or b"READY" in output):
            os.write(controller, typed)
            sent = True
    os.close(controller)
    return process.wait(timeout=30), output


def test_terminal_and_shell(project: Project) -> None:
    code, output = _in_terminal(
        project,
        [
            "run",
            "--",
            "sh",
            "-c",
            "test -t 0 && test -t 1 && echo IN-A-TTY; echo READY; read line; echo got-$line",
        ],
        b"typed\n",
    )
    assert code == 0, output
    assert b"IN-A-TTY" in output and b"got-typed" in output
    code, output = _in_terminal(project, ["shell"], b"echo shell-$((6*7)); exit 7\n")
    assert code == 7, output
    assert b"shell-42" in output


def test_shell_needs_a_terminal(project: Project) -> None:
    result = project.gpuenv("shell")
    assert gpuenv_failed(result, 2)
    assert "gpuenv shell needs a terminal" in result.stderr


def test_sigterm_is_forwarded(project: Project) -> None:
    process = _start(project, "--", "sleep", "300")
    (container,) = _running(project)
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=30)
    assert process.returncode == 143  # the command got SIGTERM and its code came back
    assert docker("ps", "-aq", "--filter", f"id={container}").stdout.strip() == ""


def test_spec_env_refers_to_the_images_own_variables(make_project) -> None:
    """`PATH: /opt/tools/bin:$PATH` (issue 31): expanded against the image's environment,
    as a Dockerfile's ENV is; passed literally, every command in the container would be
    exit 127. The same values go into an exported Compose file, escaped for Compose."""
    made = make_project(
        spec="gpus: none\nenv:\n"
        '  PATH: "/opt/tools/bin:$PATH"\n'
        '  WITH_DEFAULT: "${GPUENV_NOT_IN_THE_IMAGE:-fallback}/lib"\n'
        "  LITERAL: 'costs \\$5'\n"
    )
    tag = made.ok("build", "-q").stdout.strip()
    image_path = docker("run", "--rm", tag, "printenv", "PATH").stdout.strip()
    result = made.ok("run", "--", "sh", "-c", 'echo "$PATH|$WITH_DEFAULT|$LITERAL"')
    assert result.stdout.strip() == f"/opt/tools/bin:{image_path}|fallback/lib|costs $5"
    compose = yaml.safe_load(made.ok("export", "compose", "--", "true").stdout)
    (service,) = compose["services"].values()
    assert service["environment"]["PATH"] == f"/opt/tools/bin:{image_path}"
    assert service["environment"]["LITERAL"] == "costs $$5"


def test_started_in_a_subfolder_finds_the_project_and_starts_there(project: Project) -> None:
    """gpuenv.yaml is found in a folder above (as git, uv and Compose find theirs), and
    the command starts in the same subfolder of /workspace."""
    sub = project.path / "src" / "models"
    sub.mkdir(parents=True)
    result = subprocess.run(
        [*GPUENV, "run", "--", "pwd"],
        capture_output=True,
        text=True,
        env=project.env,
        cwd=sub,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "/workspace/src/models"
