"""gpuenv.lock's Python packages as a PEP 751 `pylock.toml`, for pip (`pip install -r
pylock.toml`, pip 26.1 and later), uv (`uv pip install -r pylock.toml`) and security
scanners: every package with its version, index, file URL and sha256.

PEP 751 rather than a hashed requirements file: it is the standard lock format pip and
uv read and write, it keeps the index each file came from, and it has room (`[tool]`)
for what gpuenv adds: the base image by digest, and what it holds. The packages of the
base itself are not in it (NVIDIA's builds are on no index): install it on that base.
"""

from __future__ import annotations

import json

from gpuenv.lock.lockfile import Lock
from gpuenv.lock.overlay import LockedPackage


def _string(text: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's for these)."""
    return json.dumps(text, ensure_ascii=False)


def _file(package: LockedPackage) -> str:
    return (
        f"{{ name = {_string(package.file)}, url = {_string(package.url)}, "
        f"hashes = {{ sha256 = {_string(package.sha256)} }} }}"
    )


def render_pylock(lock: Lock) -> str:
    """The lock's overlay as pylock.toml text (its packages in the order builds install
    them: each only once, since they are installed without dependencies)."""
    overlay = lock.overlay
    lines = [
        "# Written by `gpuenv export pylock` from gpuenv.lock: the Python packages gpuenv",
        f"# installs on {lock.pinned_image}.",
        "# Install them there, without dependencies: pip install --no-deps -r pylock.toml",
        'lock-version = "1.0"',
        'created-by = "gpuenv"',
    ]
    python = lock.resolved.get("python")
    if overlay.base is not None and overlay.base.python:
        python = ".".join(overlay.base.python.split(".")[:2])
    if isinstance(python, str) and python:
        lines.append(f"requires-python = {_string('==' + python + '.*')}")
    for package in overlay.packages:
        lines += [
            "",
            "[[packages]]",
            f"name = {_string(package.name)}",
            f"version = {_string(package.version)}",
        ]
        if package.index:
            lines.append(f"index = {_string(package.index)}")
        if package.sdist:
            lines.append(f"sdist = {_file(package)}")
        else:
            lines.append(f"wheels = [{_file(package)}]")
    lines += ["", "[tool.gpuenv]", f"base = {_string(lock.pinned_image)}"]
    if overlay.base is not None:
        lines += [
            f"base-python-distributions = {overlay.base.distributions}",
            f"base-inventory = {_string(overlay.base.inventory)}",
        ]
    return "\n".join(lines) + "\n"
