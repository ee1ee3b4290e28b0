"""The shape STYLE.md asks for, beyond the import contracts (.importlinter) and ruff's
complexity rules (both run by `make test`): a light start, a lazily loaded command tree."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("rich", "docker", "yaml", "packaging", "pynvml", "http.client", "prometheus_client")


def _loaded_after(argv: list[str]) -> tuple[str, set[str]]:
    code = (
        "import sys\n"
        "from gpuenv.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        "print('MODULES=' + ','.join(sorted(sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    line = next(x for x in result.stdout.splitlines() if x.startswith("MODULES="))
    return result.stdout, set(line.removeprefix("MODULES=").split(","))


def test_version_starts_without_heavy_imports() -> None:
    output, modules = _loaded_after(["--version"])
    assert "gpuenv, version" in output
    assert not modules & set(HEAVY)
    tree = {
        "gpuenv.cli.context",
        "gpuenv.cli.tree",
        "gpuenv.cli.base",
        "gpuenv.cli.failure",
        "gpuenv.cli.output",
        "gpuenv.cli.quiet",
    }
    assert not {m for m in modules if m.startswith("gpuenv.cli.")} - tree


@pytest.mark.parametrize(
    ("argv", "loaded", "not_loaded"),
    [
        (["run", "--help"], "gpuenv.cli.run", "gpuenv.cli.images"),
        (["matrix", "--help"], "gpuenv.cli.matrix", "gpuenv.cli.run"),
        (["export", "--help"], "gpuenv.cli.cluster", "gpuenv.cli.project"),
    ],
)
def test_commands_load_only_their_group(argv: list[str], loaded: str, not_loaded: str) -> None:
    _, modules = _loaded_after(argv)
    assert loaded in modules
    assert not_loaded not in modules
