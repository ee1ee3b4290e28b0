"""The fast path (`gpuenv.cli.fast`) beside the click command tree: for every command
line it takes, the same call with the same arguments, the same output and the same exit
code; every other command line is left to click."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gpuenv.cli import fast, main
from gpuenv.errors import EngineError, UsageError

from .fake_engine import FakeEngine

TAKEN = [
    ["run", "--", "true"],
    ["run", "--gpus", "1", "--", "true"],
    ["run", "--gpus=0,2", "-q", "--", "sh", "-c", "echo $HOME"],
    ["run", "-q", "--quiet", "--gpus", "1", "--gpus", "none", "--", "true"],
    ["run", "train.py", "--lr", "3e-4"],
    ["run", "train.py", "--", "x"],
    ["run", "--", "--help"],
    ["run", "--gpus", "", "--", "true"],
]

LEFT = [
    ["run"],
    ["run", "--"],
    ["run", "--help"],
    ["run", "--memory", "8g", "--", "true"],
    ["run", "-e", "A=1", "--", "true"],
    ["run", "--gpus", "--", "true"],
    ["run", "--gpus"],
    ["run", "-qe", "A", "--", "true"],
    ["run", "--root", "--", "true"],
    ["run", "-d", "--", "true"],
    ["run", "--name", "x", "-d", "--", "true"],
    ["run", "--mount", "/data:/data", "--", "true"],
    ["run", "--allow-mount", "/etc", "--", "true"],
    ["shell"],
    ["build", "--help"],
    ["build", "-q", "--pull"],
    ["--debug", "run", "--", "true"],
    ["-C", "/no/such/folder", "run", "--", "true"],
    ["-C"],
    ["--version"],
    ["ps"],
    [],
]


@pytest.mark.parametrize("argv", LEFT, ids=" ".join)
def test_other_command_lines_are_left_to_click(argv: list[str]) -> None:
    assert fast.parse(argv) is None


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """launch_run, recorded instead of run (it ends the process, as the real one does);
    the hook told once the container runs comes last."""
    calls: list[tuple[Any, ...]] = []

    def launch_run(directory: str, quiet: bool, **options: Any) -> None:
        started = options.pop("started", None)
        calls.append((directory, quiet, options, started))
        sys.exit(0)

    monkeypatch.setattr("gpuenv.cli.running.launch_run", launch_run)
    return calls


@pytest.mark.parametrize("argv", TAKEN, ids=" ".join)
def test_run_is_called_as_click_calls_it(
    argv: list[str], tmp_path: Path, recorded: list[tuple[Any, ...]]
) -> None:
    line = ["-C", str(tmp_path), *argv]
    assert fast.parse(line) is not None
    clicked = CliRunner().invoke(main, line, catch_exceptions=False)
    assert clicked.exit_code == 0, clicked.output
    with pytest.raises(SystemExit) as ended:
        fast.entry(line)
    assert ended.value.code == 0
    assert len(recorded) == 2
    assert recorded[0][:3] == recorded[1][:3]
    # Only the fast path holds off garbage collection while starting, and restarts it.
    assert (recorded[0][3], recorded[1][3]) == (None, fast._collect_again)


@pytest.mark.parametrize(
    ("failure", "code"),
    [
        (UsageError("--gpus 'x': not a GPU request", hint="gpuenv run --help"), 2),
        (EngineError("cannot reach the Docker engine at unix:///x: is it running?"), 10),
        (KeyboardInterrupt(), 130),
        (RuntimeError("a bug"), 1),
        (PermissionError(13, "Permission denied", "/proj/gpuenv.lock"), 8),
        (OSError(28, "No space left on device"), 8),
        (OSError(99, "Cannot assign requested address"), 1),
        (BrokenPipeError(32, "Broken pipe"), 141),
    ],
    ids=["usage", "engine", "interrupt", "internal", "eacces", "enospc", "other-os", "pipe"],
)
def test_failures_read_the_same(
    failure: BaseException,
    code: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def launch_run(directory: str, quiet: bool, **options: Any) -> None:
        raise failure

    monkeypatch.setattr("gpuenv.cli.running.launch_run", launch_run)
    monkeypatch.delenv("GPUENV_DEBUG", raising=False)
    line = ["-C", str(tmp_path), "run", "--gpus", "1", "--", "true"]
    clicked = CliRunner().invoke(main, line)
    with pytest.raises(SystemExit) as ended:
        fast.entry(line)
    shown = capsys.readouterr()
    assert (ended.value.code, shown.out, shown.err) == (clicked.exit_code, "", clicked.stderr)
    assert ended.value.code == code


def test_warnings_read_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A GpuenvWarning from the core is `warning: ...` on stderr on both paths."""
    import warnings

    from gpuenv.errors import GpuenvWarning

    def launch_run(directory: str, quiet: bool, **options: Any) -> None:
        warnings.warn(
            "the overlay belongs to another user: the shipped matrix is used",
            GpuenvWarning,
            stacklevel=2,
        )
        sys.exit(0)

    monkeypatch.setattr("gpuenv.cli.running.launch_run", launch_run)
    line = ["-C", str(tmp_path), "run", "--", "true"]
    clicked = CliRunner().invoke(main, line)
    with pytest.raises(SystemExit) as ended:
        fast.entry(line)
    shown = capsys.readouterr()
    assert (ended.value.code, shown.err) == (clicked.exit_code, clicked.stderr)
    assert shown.err.startswith("warning: the overlay belongs to another user")


def test_a_real_failure_reads_the_same_in_a_process(tmp_path: Path) -> None:
    """No project in the folder: the message and exit code, through `python -m gpuenv.cli`
    (the fast path) and through the click tree."""
    line = ["-C", str(tmp_path), "run", "--gpus", "1", "--", "true"]
    quick = subprocess.run(
        [sys.executable, "-m", "gpuenv.cli", *line], capture_output=True, text=True
    )
    tree = subprocess.run(
        [sys.executable, "-c", f"from gpuenv.cli import main; main({line!r})"],
        capture_output=True,
        text=True,
    )
    assert quick.returncode == tree.returncode != 0
    assert quick.stderr == tree.stderr and "gpuenv.yaml" in quick.stderr
    assert quick.stdout == tree.stdout == ""


def test_the_fast_run_does_not_load_click(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from gpuenv.cli import fast\n"
        f"try:\n    fast.entry({['-C', str(tmp_path), 'run', '--', 'true']!r})\n"
        "except SystemExit:\n    pass\n"
        "print('MODULES=' + ','.join(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    modules = set(out.rsplit("MODULES=", 1)[1].strip().split(","))
    assert "gpuenv.cli.running" in modules  # it got as far as running the command
    # (http.client is loaded: it comes with docker-py, the engine's one adapter.)
    assert not modules & {"click", "gpuenv.cli.tree", "gpuenv.cli.app"}


@pytest.mark.parametrize("argv", [["build"], ["build", "-q"], ["build", "--bake", "--quiet"]])
def test_the_no_op_build_says_what_click_says(
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    engine = FakeEngine(images_present={"gpuenv/demo:0123456789abcdef"})
    # The command modules first: imported after base.engine is patched, they would keep
    # the fake as the engine they restore to, for every later test.
    monkeypatch.setattr("gpuenv.cli.images.engine", lambda: engine)
    monkeypatch.setattr("gpuenv.cli.app.engine", lambda: engine, raising=False)
    monkeypatch.setattr("gpuenv.cli.base.engine", lambda: engine)
    monkeypatch.setattr(
        "gpuenv.project.stamp.fresh_tag", lambda directory, bake: "gpuenv/demo:0123456789abcdef"
    )
    line = ["-C", str(tmp_path), *argv]
    clicked = CliRunner().invoke(main, line, catch_exceptions=False)
    with pytest.raises(SystemExit) as ended:
        fast.entry(line)
    shown = capsys.readouterr()
    assert (ended.value.code, shown.out, shown.err) == (
        clicked.exit_code,
        clicked.stdout,
        clicked.stderr,
    )
    assert shown.out == "gpuenv/demo:0123456789abcdef\n"


def test_a_build_with_work_goes_to_click(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No stamp: the fast path hands over, and click's build reports the missing project."""
    monkeypatch.setattr("gpuenv.cli.images.engine", lambda: FakeEngine())  # first: see above
    monkeypatch.setattr("gpuenv.cli.base.engine", lambda: FakeEngine())
    line = ["-C", str(tmp_path), "build", "-q"]
    clicked = CliRunner().invoke(main, line)
    with pytest.raises(SystemExit) as ended:
        fast.entry(line)
    assert ended.value.code == clicked.exit_code != 0
    assert capsys.readouterr().err == clicked.stderr
    assert "gpuenv.yaml" in clicked.stderr


@pytest.mark.parametrize(
    ("code", "status", "err"),
    [(None, 0, ""), (0, 0, ""), (3, 3, ""), ("gpuenv: said", 1, "gpuenv: said\n")],
)
def test_the_hard_exit_flushes_and_exits_as_sys_exit(code: object, status: int, err: str) -> None:
    """gpuenv's own process skips the interpreter's teardown, not its output."""
    script = f"import sys\nfrom gpuenv.cli import fast\nprint('out', end='')\nfast._exit({code!r}, True)\n"
    ended = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert (ended.returncode, ended.stdout, ended.stderr) == (status, "out", err)


def test_the_hard_exit_says_a_closed_pipe_as_141() -> None:
    script = (
        "import sys\nfrom gpuenv.cli import fast\n"
        "sys.stdout = open(1, 'w', closefd=False)\n"  # buffered, whatever PYTHONUNBUFFERED says
        "sys.stdin.read()\nprint('out', end='')\nfast._exit(0, True)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert child.stdin is not None and child.stdout is not None
    child.stdout.close()  # the reader went away before the output was flushed
    child.stdin.close()
    assert child.wait(timeout=30) == 141


def test_a_quiet_view_loads_no_rich() -> None:
    """`gpuenv build -q` (or a run that builds, quietly) shows nothing: rich stays out."""
    code = (
        "import sys\nfrom gpuenv.cli.base import view_factory\n"
        "view = view_factory(True)()\nview.build_started('x')\n"
        "print(type(view).__name__, 'rich' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.split() == ["QuietView", "False"], out.stderr


def test_a_bare_system_exit_ends_the_fast_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`sys.exit()` (code None) is exit 0, never a hand-over to click, which would run
    the command a second time."""
    calls: list[str] = []

    def launch_run(directory: str, quiet: bool, **options: Any) -> None:
        calls.append(directory)
        sys.exit()

    monkeypatch.setattr("gpuenv.cli.running.launch_run", launch_run)
    with pytest.raises(SystemExit) as ended:
        fast.entry(["-C", str(tmp_path), "run", "--", "true"])
    assert ended.value.code == 0 and len(calls) == 1


def test_the_hard_exit_takes_a_closed_descriptor() -> None:
    """`gpuenv run -- true >&-` (cron): no stdout at all is no failure."""
    script = "import sys\nfrom gpuenv.cli import fast\nfast._exit(0, True)\n"
    ended = subprocess.run(
        ["sh", "-c", f'exec {sys.executable} -c "$0" >&-', script], capture_output=True
    )
    assert (ended.returncode, ended.stderr) == (0, b"")


def test_the_hard_exit_runs_the_atexit_handlers() -> None:
    script = (
        "import atexit\nfrom gpuenv.cli import fast\n"
        "atexit.register(print, 'handled')\nfast._exit(4, True)\n"
    )
    ended = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert (ended.returncode, ended.stdout) == (4, "handled\n")


def test_the_click_path_exits_as_click_says(tmp_path: Path) -> None:
    """Through the command tree (here: a usage error, and --version), gpuenv's own
    process ends with click's code and output, without the teardown."""
    wrong = subprocess.run(
        [sys.executable, "-m", "gpuenv.cli", "resolve", "--no-such-option"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert wrong.returncode == 2 and "--no-such-option" in wrong.stderr
    version = subprocess.run(
        [sys.executable, "-m", "gpuenv.cli", "--version"], capture_output=True, text=True
    )
    assert version.returncode == 0 and version.stdout.strip()
