"""The shape the style guide (docs/development/style.md) asks for, beyond the import
contracts (.importlinter) and ruff's complexity rules (both run by `make test`): a light
start, a lazily loaded command tree, every module importable alone with no package `__init__`
loading its own modules, and an architecture page that maps the packages as they are."""

from __future__ import annotations

import ast
import configparser
import re
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("rich", "docker", "yaml", "packaging", "pynvml", "http.client", "prometheus_client")


def _loaded_after(argv: list[str]) -> tuple[str, set[str]]:
    code = (
        "import sys\n"
        "from gpuenv.cli.tree import main\n"
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


ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gpuenv"


def _packages() -> set[str]:
    """gpuenv's packages, as `reservations` or `engine`: the folders with an __init__.py."""
    return {p.parent.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("__init__.py")} - {"."}


def _modules() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__main__":  # runs the command when imported
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_every_module_imports_alone() -> None:
    """Each module imported first, in a fresh set of gpuenv modules: an import that only
    works after another module was loaded (a loop through a package's __init__, a name
    taken from a half-loaded module) fails here, whatever order the tests import in."""
    code = (
        "import importlib, sys, traceback\n"
        "failed = []\n"
        "for name in sys.argv[1:]:\n"
        "    for loaded in [m for m in sys.modules if m == 'gpuenv' or m.startswith('gpuenv.')]:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception:\n"
        "        failed.append(name + ': ' + traceback.format_exc(limit=-1).strip())\n"
        "print('\\n'.join(failed))\n"
    )
    modules = _modules()
    assert len(modules) > 150 and "gpuenv.cli.context" in modules
    result = subprocess.run(
        [sys.executable, "-c", code, *modules], capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", result.stdout


def test_no_package_init_loads_its_own_modules() -> None:
    """A package's __init__ that imports its own modules is a loop waiting to happen:
    importing any module of the package runs the __init__ first, which imports the
    module's siblings, which import the package back. (`gpuenv.cli` once loaded the whole
    command tree that way.) Imports inside functions run later, and are allowed."""
    found = []
    for init in PACKAGE.rglob("__init__.py"):
        package = ".".join(init.parent.relative_to(ROOT).parts)
        for node in ast.parse(init.read_text()).body:  # module level only
            if isinstance(node, ast.ImportFrom) and node.module:
                target = node.module
            elif isinstance(node, ast.Import):
                target = node.names[0].name
            else:
                continue
            if target == package or target.startswith(package + "."):
                found.append(f"{init.relative_to(ROOT)}:{node.lineno}: imports {target}")
    assert found == []


ARCHITECTURE = ROOT / "docs" / "development" / "architecture.md"


def test_the_architecture_page_maps_every_package() -> None:
    """The page's tree and its table name every package there is, and nothing else."""
    text = ARCHITECTURE.read_text()
    tree = text[text.index("```\ngpuenv/") : text.index("```", text.index("```\ngpuenv/") + 3)]
    in_tree = set(re.findall(r"^  (\w+)/", tree, re.M))
    in_table = set(re.findall(r"^\| `gpuenv/(\w+)/` \|", text, re.M))
    top = {p for p in _packages() if "/" not in p}
    assert in_tree == top, in_tree ^ top
    assert in_table == top, in_table ^ top


def test_the_architecture_page_says_the_layers_of_the_contract() -> None:
    """The layers the page lists, in order, are those .importlinter enforces."""
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    layers = config["importlinter:contract:layers"]["layers"]
    names = [name.strip() for name in re.split(r"[|:\n]", layers)]
    enforced = [name.removeprefix("gpuenv.") for name in names if name]
    text = ARCHITECTURE.read_text()
    rule = text[text.index("**Layers**:") : text.index("No module imports one of a layer")]
    assert re.findall(r"`([\w.]+)`", rule) == enforced
