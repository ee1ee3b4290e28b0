"""Where gpuenv keeps a user's own files, one rule for each: platformdirs' (the XDG base
directories on Linux), unless a GPUENV_* variable names the place.

- the cache (GPUENV_CACHE_DIR, else ``~/.cache/gpuenv``): the validated matrix, preflight
  verdicts, build stamps (``builds/``), Apptainer images (``sif/``); safe to delete;
- the data (GPUENV_DATA_DIR, else ``~/.local/share/gpuenv``): the matrix overlay;
- the config (GPUENV_CONFIG, else ``~/.config/gpuenv/config.yaml``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import platformdirs

CACHE_ENV = "GPUENV_CACHE_DIR"
DATA_ENV = "GPUENV_DATA_DIR"
CONFIG_ENV = "GPUENV_CONFIG"


def user_cache_dir(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get(CACHE_ENV) or platformdirs.user_cache_dir("gpuenv", appauthor=False)


def user_data_dir(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get(DATA_ENV) or platformdirs.user_data_dir("gpuenv", appauthor=False)


def user_config_file(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get(CONFIG_ENV) or os.path.join(
        platformdirs.user_config_dir("gpuenv", appauthor=False), "config.yaml"
    )


def make_user_dir(path: str, mode: int = 0o700) -> None:
    """`os.makedirs(path)` for one of the user's own folders, except under a HOME that
    does not exist: a service account or a container with HOME=/nonexistent must not get
    one made by gpuenv. FileNotFoundError then, which every caller of a cache takes as
    "no cache"."""
    home = os.environ.get("HOME")
    if home and os.path.isabs(home) and not os.path.isdir(home):
        inside = os.path.commonpath([os.path.abspath(path), os.path.abspath(home)])
        if inside == os.path.abspath(home):
            raise FileNotFoundError(2, "HOME does not exist: not created", home)
    os.makedirs(path, mode=mode, exist_ok=True)
