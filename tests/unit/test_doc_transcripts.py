"""The README's and the quickstart's console blocks are what gpuenv prints (issue 31,
item 6): each block is replayed, in order, in one project folder, on a machine without
an NVIDIA driver and without a container engine (as the docs say they ran), and every
line it shows must be the line gpuenv prints now.

The prose between blocks edits files ("edit `version: "2.4"` in gpuenv.yaml"); those
edits are made here too, and the test fails when the prose stops saying them.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/getting-started/quickstart.md")
# What the prose before a block asks the reader to do, as (text the prose must say,
# file, old, new): made before that block runs.
EDITS = {
    2: [
        (
            '`version: "2.4"` in `gpuenv.yaml`',
            "gpuenv.yaml",
            re.compile(r"^version: .*$", re.M),
            'version: "2.4"',
        ),
        (
            "`torch==2.4.0` in `requirements.txt`",
            "requirements.txt",
            re.compile(r"^torch==.*$", re.M),
            "torch==2.4.0",
        ),
    ]
}


def console_blocks(text: str) -> list[tuple[str, list[tuple[str, list[str]]]]]:
    """Each ```console block: (the prose before it, [(command, output lines)])."""
    out = []
    for match in re.finditer(r"```console\n(.*?)```", text, re.S):
        steps: list[tuple[str, list[str]]] = []
        for line in match.group(1).splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], []))
            elif steps:
                steps[-1][1].append(line)
        before = text[: match.start()]
        prose = before[before.rfind("```") + 3 :] if "```" in before else before
        out.append((prose, steps))
    return out


def run(command: str, folder: Path, home: Path) -> list[str]:
    argv = shlex.split(command)
    if argv[0] == "cat":
        return (folder / argv[1]).read_text().splitlines()
    assert argv[0] == "gpuenv", f"a console block runs {argv[0]}: teach this test how"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_STATE_HOME": str(home / ".state"),
        "GPUENV_STATE_DIR": str(home / "state"),
        "DOCKER_HOST": f"unix://{home}/no-engine.sock",  # the docs ran without one
        "GPUENV_NVML_LIBRARY": str(home / "no-libnvidia-ml.so.1"),
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": str(REPO),
        "NO_COLOR": "1",
        "LANG": "C.UTF-8",
    }
    result = subprocess.run(
        [sys.executable, "-m", "gpuenv.cli", *argv[1:]],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
    )
    # The engine the docs were written against is the default one, which is not there.
    shown = result.stdout.replace(env["DOCKER_HOST"], "unix:///var/run/docker.sock")
    return shown.splitlines()


@pytest.mark.parametrize("doc", DOCS)
def test_console_blocks_show_what_gpuenv_prints(doc: str, tmp_path: Path) -> None:
    text = (REPO / doc).read_text()
    blocks = console_blocks(text)
    assert len(blocks) >= 3, f"{doc}: its console blocks moved; update this test"
    folder, home = tmp_path / "my-project", tmp_path / "home"
    folder.mkdir()
    home.mkdir()
    for index, (prose, steps) in enumerate(blocks):
        for said, name, pattern, new in EDITS.get(index, []):
            assert said in " ".join(prose.split()), (
                f"{doc}: block {index + 1}'s prose no longer says {said}"
            )
            path = folder / name
            path.write_text(pattern.sub(new, path.read_text()))
        for command, expected in steps:
            if command.startswith("cat ") and not (folder / command.split()[1]).exists():
                (folder / command.split()[1]).write_text("\n".join(expected) + "\n")
            shown = run(command, folder, home)
            assert shown == expected, (
                f"{doc}, console block {index + 1}, `$ {command}`:\n"
                + "\n".join(f"  doc: {e}" for e in expected)
                + "\n"
                + "\n".join(f"  now: {s}" for s in shown)
            )
