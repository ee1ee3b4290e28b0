"""Tables for people, lines for scripts (issue 12, item 6): a table is drawn only on a
terminal wide enough for it; piped, redirected or too narrow, it is plain tab-separated
lines, never wrapped. NO_COLOR removes every ANSI style, bold and dim included."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuenv.cli.tree import main

REPO = Path(__file__).resolve().parents[2]


def on_terminal(args: list[str], **env: str) -> str:
    """What gpuenv writes to a terminal (a pseudo-terminal as stdout and stderr)."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuenv.cli", *args],
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=follower,
        env={**os.environ, "PYTHONPATH": str(REPO), "TERM": "xterm-256color", **env},
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert process.wait(timeout=60) == 0
    return b"".join(chunks).decode()


def test_piped_tables_are_tab_separated_and_unwrapped() -> None:
    """Issue 12: `gpuenv matrix pytorch | cat` wrapped every version."""
    result = CliRunner().invoke(main, ["matrix", "pytorch"])
    assert result.exit_code == 0
    header, *rows = result.stdout.splitlines()
    assert header.split("\t")[:3] == ["image", "version", "CUDA"]
    columns = len(header.split("\t"))
    assert rows and all(len(row.split("\t")) == columns for row in rows)
    assert "nvcr.io/nvidia/pytorch:24.06-py3\t2.4.0a0+f70bd71a48\t12.5.0" in result.stdout
    assert "│" not in result.stdout and "[" not in header  # no box, no markup
    assert "NGC PyTorch images" in result.stderr  # the title, for people


@pytest.mark.parametrize("table", ["gpus", "cuda", "jax"])
def test_every_matrix_table_degrades(table: str) -> None:
    result = CliRunner().invoke(main, ["matrix", table])
    assert result.exit_code == 0
    assert "\t" in result.stdout and "│" not in result.stdout and "━" not in result.stdout


def test_a_wide_terminal_gets_the_drawn_table_and_a_narrow_one_lines() -> None:
    wide = on_terminal(["matrix", "gpus"], COLUMNS="200")
    assert "┃" in wide or "│" in wide
    narrow = on_terminal(["matrix", "pytorch"], COLUMNS="60")
    assert "│" not in narrow and "\t" in narrow
    assert "nvcr.io/nvidia/pytorch:24.06-py3\t2.4.0a0+f70bd71a48" in narrow


def test_no_color_means_no_ansi_at_all() -> None:
    styled = on_terminal(["matrix", "gpus"], COLUMNS="200")
    assert "\x1b[" in styled
    plain = on_terminal(["matrix", "gpus"], COLUMNS="200", NO_COLOR="1")
    assert "\x1b[" not in plain and ("┃" in plain or "│" in plain)
    # An empty NO_COLOR is not set (no-color.org).
    assert "\x1b[" in on_terminal(["matrix", "gpus"], COLUMNS="200", NO_COLOR="")
