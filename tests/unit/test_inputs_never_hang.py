"""Inputs that must never hang, crash or leak (issue 22, item 10): files that are not
files, files that never end, links out of the project, and user text that looks like
rich markup or an emoji code."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from gpuenv.cli.tree import main
from gpuenv.common.files import NotAFile, read_capped
from gpuenv.errors import HostError
from gpuenv.host.hostfile import load_host_file

RTX4090 = ["--driver", "550.54.15", "--gpu", "RTX 4090"]
SECRET = "s3cret-line-of-another-file"


def fifo(tmp_path: Path) -> str:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return str(path)


def folder(tmp_path: Path) -> str:
    return str(tmp_path)


def zero(_tmp_path: Path) -> str:
    return "/dev/zero"


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (fifo, "is a named pipe, not a file"),
        (zero, "is a character device, not a file"),
        (folder, "is a folder, not a file"),
    ],
)
def test_what_is_not_a_file_is_refused_without_waiting(
    tmp_path: Path, make: Callable[[Path], str], reason: str
) -> None:
    """A FIFO with no writer would block `open` for ever; /dev/zero never ends. Both are
    refused at once (the read runs in a thread, so a hang fails the test, not the run)."""
    path = make(tmp_path)
    outcome: list[BaseException | bytes] = []

    def read() -> None:
        try:
            outcome.append(read_capped(path))
        except BaseException as exc:  # the test looks at it below
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert not reader.is_alive(), f"reading {path} hung"
    (result,) = outcome
    assert isinstance(result, NotAFile) and str(result) == reason


def test_a_file_over_the_limit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big"
    path.write_bytes(b"x" * (2 << 20) + b"y")
    with pytest.raises(NotAFile, match="larger than 2 MiB"):
        read_capped(str(path), limit=2 << 20)
    assert read_capped(str(path), limit=4 << 20).endswith(b"xy")


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (fifo, "it is a named pipe, not a file"),
        (zero, "it is a character device, not a file"),
        (folder, "it is a folder, not a file"),
    ],
)
def test_host_files_are_read_with_caps(
    tmp_path: Path, make: Callable[[Path], str], reason: str
) -> None:
    path = make(tmp_path)
    with pytest.raises(HostError) as info:
        load_host_file(path)
    assert info.value.exit_code == 7
    assert f"GPUENV_HOST_FILE={path}" in info.value.message
    assert reason in info.value.message


def test_an_empty_host_file_is_named_not_this_host(tmp_path: Path) -> None:
    """`{}` describes a host without a driver: the warnings name the file to complete,
    not "no NVIDIA driver on this host" and --driver flags."""
    host = tmp_path / "host.json"
    host.write_text("{}\n")
    result = CliRunner().invoke(
        main, ["resolve", "--framework", "pytorch"], env={"GPUENV_HOST_FILE": str(host)}
    )
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert f"the host file {host} names no driver" in said
    assert f'add "driver" (and "gpus") to {host}' in said
    assert "this host" not in said and "--driver/--gpu" not in said


def outside(tmp_path: Path) -> Path:
    secret = tmp_path / "elsewhere" / "notes.txt"
    secret.parent.mkdir()
    secret.write_text(f"{SECRET}\n")
    project = tmp_path / "project"
    project.mkdir()
    return secret


def invoke(project: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["-C", str(project), *args])


LINKED = "is a link to {secret}, outside the project folder"


@pytest.mark.parametrize(
    ("name", "command", "said"),
    [
        ("requirements.txt", ("init", *RTX4090), LINKED),
        ("pyproject.toml", ("init", *RTX4090), LINKED),
        ("environment.yml", ("init", *RTX4090), LINKED),
        ("requirements.txt", ("check",), "'requirements.txt' points outside the project folder"),
        ("base.txt", ("check",), "includes 'base.txt', which is outside the project folder"),
    ],
)
def test_a_dependency_file_linked_out_of_the_project_is_not_read(
    tmp_path: Path, name: str, command: tuple[str, ...], said: str
) -> None:
    secret = outside(tmp_path)
    project = tmp_path / "project"
    (project / name).symlink_to(secret)
    if command[0] == "check":
        listed = name if name == "requirements.txt" else "requirements.txt"
        if name != "requirements.txt":
            (project / "requirements.txt").write_text(f"-r {name}\n")
        (project / "gpuenv.yaml").write_text(
            f"name: p\nframework: pytorch\nrequirements: {listed}\n"
        )
    result = invoke(project, *command)
    assert result.exit_code == 3, result.output
    assert said.format(secret=secret) in " ".join(result.stderr.split())
    assert SECRET not in result.output  # never quoted from the other file
    assert not (project / "gpuenv.lock").exists()


def test_a_python_version_linked_out_of_the_project_is_named_not_read(tmp_path: Path) -> None:
    secret = outside(tmp_path)
    project = tmp_path / "project"
    (project / ".python-version").symlink_to(secret)
    (project / "requirements.txt").write_text("torch==2.4.0\n")
    result = invoke(project, "init", *RTX4090)
    assert result.exit_code == 0, result.output
    assert ".python-version: not read: it is a link to" in " ".join(result.stderr.split())
    assert SECRET not in result.output


@pytest.mark.parametrize(
    "text", ["/data:x:", "/data:smile:", "[bold]/data[/bold]:x:", "/data:thumbs_up:"]
)
def test_user_text_is_shown_as_written(tmp_path: Path, text: str) -> None:
    """rich would read ':x:' as an emoji code (shown as ❌) and '[bold]' as markup."""
    (tmp_path / "gpuenv.yaml").write_text(f'name: p\nframework: pytorch\nmounts:\n  - "{text}"\n')
    result = invoke(tmp_path, "check")
    assert result.exit_code == 3, result.output
    assert f"'{text}'" in result.stderr
