"""Errors a user can act on (issue 12, item 5): files and folders that cannot be read or
written, a full disk, a closed pipe, a lock another process holds. Each is a message
with the path and the fix and a documented exit code, never "internal error" (exit 1).

Root ignores permission bits, so tests that need them run the CLI in a forked child
that first drops to an unprivileged user (nobody); as a user they simply run."""

from __future__ import annotations

import errno
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuenv.cli.tree import main
from gpuenv.errors import EXIT_BROKEN_PIPE, EXIT_FILE, EXIT_INTERNAL, EXIT_LOCKED

from ..jsonschemas import validate_output

RTX4090 = ["--driver", "550.54.15", "--gpu", "RTX 4090"]
NOBODY = 65534
FILES = ("gpuenv.yaml", "gpuenv.lock", "requirements.txt", "pyproject.toml")


def _preload() -> None:
    """Everything the CLI may import, imported before the child drops root: the
    interpreter's own files may be private to root (a pyenv under /root)."""
    import importlib
    import pkgutil

    import gpuenv

    for module in pkgutil.walk_packages(gpuenv.__path__, "gpuenv."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    for name in (
        "difflib",
        "getpass",
        "pwd",
        "traceback",
        "tempfile",
        "rich.measure",
        "rich.table",
        "rich.text",
        "rich.markup",
        "rich.console",
        "jsonschema",
    ):
        importlib.import_module(name)


@functools.cache
def readable_matrices() -> str:
    """The shipped matrices where nobody can read them: the checkout may be a private
    folder (a clone in `mktemp -d`, as CI makes it)."""
    from gpuenv.matrix.load import default_matrix_dir

    folder = Path(tempfile.mkdtemp(prefix="gpuenv-matrices-"))
    copy = folder / "matrices"
    shutil.copytree(default_matrix_dir(), copy)
    for path in (folder, copy, *copy.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return str(copy)


def run_as_user(project: Path, args: list[str], env: dict[str, str]) -> dict[str, Any]:
    """The CLI in-process in a forked child running as nobody (or as this user when not
    root): its exit code, stdout and stderr."""
    env = {"GPUENV_MATRIX_DIR": readable_matrices(), **env}
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 70
        try:
            os.close(read)
            if os.getuid() == 0:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            result = CliRunner().invoke(main, ["-C", str(project), *args], env=env)
            payload = {
                "exit_code": result.exit_code,
                "stdout": result.stdout,
                "stderr": result.stderr,
                "exception": repr(result.exception)
                if result.exception and not isinstance(result.exception, SystemExit)
                else None,
            }
            with os.fdopen(write, "w") as out:
                json.dump(payload, out)
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as inp:
        data = inp.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and data, "the child failed"
    loaded: dict[str, Any] = json.loads(data)
    return loaded


@pytest.fixture(scope="module")
def valid_files() -> dict[str, bytes]:
    """A real project's files, as `gpuenv init` wrote them."""
    folder = Path(tempfile.mkdtemp(prefix="gpuenv-valid-"))
    try:
        (folder / "requirements.txt").write_text("torch==2.4.0\nnumpy\n")
        (folder / "pyproject.toml").write_text(
            '[project]\nname = "demo"\nrequires-python = ">=3.10"\ndependencies = ["torch==2.4.0"]\n'
        )
        result = CliRunner().invoke(main, ["-C", str(folder), "init", *RTX4090])
        assert result.exit_code == 0, result.output
        return {name: (folder / name).read_bytes() for name in FILES}
    finally:
        shutil.rmtree(folder)


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A folder the unprivileged child can reach (pytest's own are root's, mode 700)."""
    base = Path(tempfile.mkdtemp(prefix="gpuenv-perm-"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        for root, dirs, files in os.walk(base):
            for name in dirs + files:
                os.chmod(os.path.join(root, name), 0o700)
        shutil.rmtree(base, ignore_errors=True)


def lay_out(
    folder: Path, files: dict[str, tuple[bytes | None, int]], folder_mode: int
) -> dict[str, str]:
    """Write the project's files with their modes, owned by the child's user."""
    if folder.exists():
        folder.chmod(0o700)
        shutil.rmtree(folder)
    folder.mkdir()
    data = folder.parent / "data"
    data.mkdir(exist_ok=True)
    uid = NOBODY if os.getuid() == 0 else os.getuid()
    for name, (content, mode) in files.items():
        if content is None:
            continue
        path = folder / name
        path.write_bytes(content)
        if os.getuid() == 0:
            os.chown(path, uid, uid)
        path.chmod(mode)
    if os.getuid() == 0:
        os.chown(folder, uid, uid)
        os.chown(data, uid, uid)
    folder.chmod(folder_mode)
    return {
        "GPUENV_DATA_DIR": str(data),
        "XDG_CACHE_HOME": str(data / "cache"),
        "HOME": str(data),
    }


CONTENTS = st.one_of(
    st.just("valid"),
    st.none(),
    st.just(b""),
    st.binary(max_size=200),
    st.text(max_size=200).map(lambda text: text.encode("utf-8", "surrogatepass")),
)
MODES = st.one_of(st.sampled_from([0o644, 0o600, 0o444, 0o200, 0o000]), st.integers(0, 0o777))
COMMANDS = st.sampled_from(
    [
        ["check"],
        ["check", "--json"],
        ["lock", "--check"],
        ["lock"],
        ["lock", "--upgrade", *RTX4090],
        ["init", "--force", *RTX4090],
        ["resolve", "--json"],
        ["render"],
    ]
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    contents=st.tuples(*(CONTENTS for _ in FILES)),
    modes=st.tuples(*(MODES for _ in FILES)),
    folder_mode=st.sampled_from([0o755, 0o555, 0o355, 0o111, 0o700]),
    command=COMMANDS,
)
def test_no_file_permission_or_content_is_an_internal_error(
    scratch: Path,
    valid_files: dict[str, bytes],
    contents: tuple[Any, ...],
    modes: tuple[int, ...],
    folder_mode: int,
    command: list[str],
) -> None:
    """Issue 12 (done when): arbitrary permissions and contents of the project's files
    never produce exit 1, and a --json run prints what its schema allows."""
    files = {
        name: (valid_files[name] if content == "valid" else content, mode)
        for name, content, mode in zip(FILES, contents, modes, strict=True)
    }
    env = lay_out(scratch / "project", files, folder_mode)
    result = run_as_user(scratch / "project", command, env)
    output = result["stdout"] + result["stderr"]
    assert result["exit_code"] != EXIT_INTERNAL, output
    assert result["exception"] is None, output
    assert "internal error" not in output and "Traceback" not in output
    if "--json" in command and result["exit_code"] != 0:
        validate_output(command[0], result["stdout"])


@pytest.fixture(scope="module", autouse=True)
def _loaded() -> None:
    _preload()


def test_an_unreadable_requirements_file_is_named_and_check_says_no_valid(
    scratch: Path, valid_files: dict[str, bytes]
) -> None:
    """Issue 12: "internal error: PermissionError … this is a bug" (exit 1), and check
    printed "✓ gpuenv.yaml: valid" first."""
    files = {name: (valid_files[name], 0o644) for name in FILES}
    files["requirements.txt"] = (valid_files["requirements.txt"], 0o000)
    env = lay_out(scratch / "project", files, 0o755)
    result = run_as_user(scratch / "project", ["check"], env)
    assert result["exit_code"] == EXIT_FILE
    assert (
        "cannot read" in result["stderr"]
        and "requirements.txt: permission denied" in result["stderr"]
    )
    assert "gpuenv.yaml: valid" not in result["stderr"]
    for command in (["lock", "--check"], ["render"], ["lock"]):
        again = run_as_user(scratch / "project", command, env)
        assert again["exit_code"] == EXIT_FILE, again
        assert "requirements.txt" in again["stderr"] and "hint:" in again["stderr"]


def test_a_read_only_project_folder_says_which_folder(
    scratch: Path, valid_files: dict[str, bytes]
) -> None:
    files = {name: (valid_files[name], 0o644) for name in FILES}
    files["gpuenv.lock"] = (None, 0)
    env = lay_out(scratch / "project", files, 0o555)
    result = run_as_user(scratch / "project", ["lock", *RTX4090], env)
    assert result["exit_code"] == EXIT_FILE, result
    assert f"cannot write {scratch / 'project' / 'gpuenv.lock'}" in result["stderr"]
    assert f"creating a file in {scratch / 'project'}" in result["stderr"]
    assert "Traceback" not in result["stderr"]
    failure = run_as_user(scratch / "project", ["lock", *RTX4090, "--json"], env)
    value = validate_output("lock", failure["stdout"])
    assert value["error"]["type"] == "FileAccessError"
    assert value["error"]["path"] == str(scratch / "project" / "gpuenv.lock")


def test_another_users_data_folder_is_a_warning_not_a_failure(
    scratch: Path, valid_files: dict[str, bytes], tmp_path: Path
) -> None:
    """Why db7a8e8 was reverted: gpuenv run as another user with root's GPUENV_DATA_DIR
    (a private folder) exited 6. The overlay is per user: theirs is skipped, with why."""
    files = {name: (valid_files[name], 0o644) for name in FILES}
    env = lay_out(scratch / "project", files, 0o755)
    private = tmp_path / "root-data"
    private.mkdir(mode=0o700)
    (private / "matrix-overlay.yaml").write_text("schema: 1\n")
    env["GPUENV_DATA_DIR"] = str(private)
    result = run_as_user(scratch / "project", ["check"], env)
    if os.getuid() != 0:
        pytest.skip("needs another user's folder")
    assert result["exit_code"] == 0, result
    assert "belongs to another user (root)" in result["stderr"]
    assert "using the shipped matrix" in result["stderr"]


def test_a_full_disk_leaves_the_old_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC while writing: exit 8, the path, the fix; the old lock is untouched and no
    temporary file is left behind."""
    (tmp_path / "requirements.txt").write_text("torch==2.4.0\n")
    assert CliRunner().invoke(main, ["-C", str(tmp_path), "init", *RTX4090]).exit_code == 0
    before = (tmp_path / "gpuenv.lock").read_bytes()
    listing = sorted(os.listdir(tmp_path))

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    result = CliRunner().invoke(
        main, ["-C", str(tmp_path), "lock", "--upgrade", "--driver", "560.28.03"]
    )
    assert result.exit_code == EXIT_FILE, result.output
    assert f"cannot write {tmp_path / 'gpuenv.lock'}: no space left on device" in result.stderr
    assert "df -h" in result.stderr and "the old file is unchanged" in result.stderr
    assert (tmp_path / "gpuenv.lock").read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == listing


def test_an_os_error_anywhere_is_a_file_error_not_a_bug(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one error path turns an OSError no command caught into exit 8 with its path."""
    import gpuenv.cli.project as policy  # where the command calls it

    def refuse(*args: object, **kwargs: object) -> object:
        raise PermissionError(errno.EACCES, "Permission denied", "/srv/shared/gpuenv.yaml")

    monkeypatch.setattr(policy, "check_project", refuse)
    result = CliRunner().invoke(main, ["-C", str(tmp_path), "check", "--json"])
    assert result.exit_code == EXIT_FILE
    value = validate_output("check", result.stdout)
    assert value["error"]["path"] == "/srv/shared/gpuenv.yaml"
    assert "cannot access /srv/shared/gpuenv.yaml: permission denied" in result.stderr


def _with_stdout_closed(args: list[str], cwd: Path) -> tuple[int, str]:
    """gpuenv ARGS in a process whose stdout reader is gone before it writes: its exit
    code and stderr."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuenv.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=env,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    stderr = process.stderr.read().decode()
    return process.wait(timeout=60), stderr


@pytest.mark.parametrize(
    "args",
    [
        ["matrix", "pytorch"],
        ["matrix", "--json"],
        ["--help"],
        ["check", "--help"],
        ["resolve", "--framework", "pytorch", "--driver", "550.54.15", "--explain"],
    ],
)
def test_a_closed_pipe_is_exit_141_without_a_traceback(args: list[str], tmp_path: Path) -> None:
    """`gpuenv check | head -1` exited 1 on the broken pipe: now as any Unix tool that
    SIGPIPE stops (141), silently. The reader is gone before gpuenv writes."""
    code, stderr = _with_stdout_closed(args, tmp_path)
    assert code == EXIT_BROKEN_PIPE, stderr
    assert "Traceback" not in stderr and "Exception ignored" not in stderr


def test_a_second_lock_names_the_holder(tmp_path: Path) -> None:
    """Concurrent `gpuenv lock`: the second waits GPUENV_LOCK_TIMEOUT, then exit 9 naming
    the first (its pid, user and command), with the fix."""
    from gpuenv.common.filelock import exclusive

    (tmp_path / "requirements.txt").write_text("torch==2.4.0\n")
    assert CliRunner().invoke(main, ["-C", str(tmp_path), "init", *RTX4090]).exit_code == 0
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        "GPUENV_LOCK_TIMEOUT": "0.3",
    }
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from gpuenv.common.filelock import exclusive\n"
            "with exclusive(sys.argv[1]):\n print('held', flush=True); time.sleep(30)",
            str(tmp_path / "gpuenv.lock"),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        second = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpuenv.cli",
                "-C",
                str(tmp_path),
                "lock",
                "--upgrade",
                "--json",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert second.returncode == EXIT_LOCKED, second.stderr
        assert f"pid {holder.pid}" in second.stderr and f"kill {holder.pid}" in second.stderr
        assert "GPUENV_LOCK_TIMEOUT" in second.stderr
        assert validate_output("lock", second.stdout)["error"]["type"] == "LockHeld"
    finally:
        holder.kill()
        holder.wait()
    # Released when its process ended, however it ended: the next writer goes ahead.
    with exclusive(str(tmp_path / "gpuenv.lock"), timeout=0):
        pass
    again = CliRunner().invoke(main, ["-C", str(tmp_path), "lock", "--upgrade"])
    assert again.exit_code == 0, again.output


def test_check_into_a_closed_pipe_keeps_its_own_exit_code(tmp_path: Path) -> None:
    """`gpuenv check | head -1` (issue 12): check reports on stderr, so a closed stdout
    changes nothing and it exits with its own code (3: no gpuenv.yaml here), never 1;
    `check --json` writes to stdout and stops as SIGPIPE would (141)."""
    for args, code in ((["check"], 3), (["check", "--json"], EXIT_BROKEN_PIPE)):
        exited, stderr = _with_stdout_closed(args, tmp_path)
        assert exited == code, stderr
        assert "Traceback" not in stderr and "internal error" not in stderr


@pytest.mark.parametrize(
    "args",
    [
        ["build"],  # no gpuenv.yaml here: exit 3, said on the closed pipe
        ["run", "--", "true"],
        ["lock"],
        ["build", "--no-such-option"],  # a usage error, which click would exit 1 on
        ["--no-such-option"],
        ["matrix", "pytorch"],
    ],
)
def test_a_closed_pipe_for_stdout_and_stderr_is_exit_141(args: list[str], tmp_path: Path) -> None:
    """`gpuenv build 2>&1 | head`: the reader of both streams is gone. What gpuenv then
    has to say, error or usage, meets the closed pipe: 141, as SIGPIPE, never exit 1."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    read, write = os.pipe()
    os.close(read)
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuenv.cli", *args],
        stdout=write,
        stderr=write,
        cwd=tmp_path,
        env=env,
    )
    os.close(write)
    assert process.wait(timeout=60) == EXIT_BROKEN_PIPE
