"""The NGC "meets this pin" rule is written twice: in gpuenv.project.packages (planning)
and in images/ngc/files/install.py (run by the image's own Python at build time, so it
stays standalone: stdlib and pip's packaging). One table runs through both, so the two
copies cannot drift apart."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from gpuenv.project.packages import ngc_satisfies

INSTALL_SCRIPT = Path(__file__).resolve().parents[2] / "images" / "ngc" / "files" / "install.py"


def _install_script() -> ModuleType:
    """install.py imported as a module (its main() runs only as a script)."""
    spec = importlib.util.spec_from_file_location("gpuenv_ngc_install", INSTALL_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RULES: dict[str, Callable[[str, str], bool]] = {
    "gpuenv.project.packages": ngc_satisfies,
    "images/ngc/files/install.py": _install_script().satisfies,
}

CASES = [
    # An exact pin: any build of its major.minor series (NVIDIA names a build after the
    # next release of its series).
    ("==0.20.1", "0.20.0a0+afc54f7", True),
    ("==0.21.0", "0.20.0a0+afc54f7", False),
    ("==2.5", "2.5.0a0+e000cf0ad9", True),
    ("==2.5.1", "2.5.1", True),
    ("==3.5.1", "2.5.1", False),
    # An exact pin against a release is exact (issue 22: jax==0.4.35 is not NGC JAX
    # 24.10's 0.4.33, per its release notes); trailing zeros are the same version.
    ("==0.4.35", "0.4.33", False),
    ("==0.4.33", "0.4.33", True),
    ("==2.5", "2.5.0", True),
    ("==1.26", "1.26.4", False),
    # pytorch.org's CUDA build label: a build the image replaces, read as the plain pin.
    ("==2.3.1+cu121", "2.3.0a0+40ec155e58", True),
    ("==2.3.1+cu121", "2.3.1", True),
    ("==2.3.1+cpu", "2.4.0a0+f70bd71a48", False),
    ("==0.18.1+rocm6.0", "0.18.0a0", True),
    # An exact pin of a pre-release or a local version: that build exactly.
    ("==2.5.0a0+e000cf0ad9", "2.5.0a0+e000cf0ad9", True),
    ("==2.5.0a0+other", "2.5.0a0+e000cf0ad9", False),
    ("===2.5.0a0", "2.5.0a0", True),
    # Any other specifier: against the release the build precedes.
    (">=2.5.1", "2.5.0a0+e000cf0ad9", False),
    (">=2.5.1", "2.6.0a0+df5bbc09d1", True),
    (">=2.4", "2.5.0a0", True),
    ("<2.5", "2.5.0a0", False),
    ("~=2.5", "2.5.0a0", True),
    ("!=2.5.0", "2.5.0a0+nv", False),
    ("==2.5.*", "2.5.0a0+nv", True),
    ("==2.6.*", "2.5.0a0+nv", False),
    (">=1.26,<2", "1.26.4", True),
    (">=1.26,<2", "2.1.0", False),
    ("", "2.5.0a0", True),
    # What cannot be read never matches.
    ("==2.5", "not a version", False),
    ("=>2.5", "2.5.0", False),
]


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize(("specifier", "shipped", "ok"), CASES)
def test_the_ngc_sense_of_a_pin(rule: str, specifier: str, shipped: str, ok: bool) -> None:
    assert RULES[rule](specifier, shipped) is ok


@pytest.mark.parametrize(
    "name",
    [
        "torch",
        "Flash_Attn",
        "zope.interface",
        "A--B__c",
        "ruamel.yaml.clib",
        "NVIDIA-CUDNN-CU12",
        "x",
    ],
)
def test_names_are_normalized_as_packaging_does(name: str) -> None:
    """gpuenv's PEP 503 normalization (without packaging.utils' import) is packaging's."""
    from packaging.utils import canonicalize_name

    from gpuenv.project.packages import normalize

    assert normalize(name) == canonicalize_name(name)
