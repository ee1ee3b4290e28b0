"""The host-wide admin config, /etc/gpuenv/config.toml (GPUENV_SYSTEM_CONFIG): policy
and settings only root writes ([idle] for `gpuenv idle --enforce`, [history] for the
dashboard's sampler, [sizing] for `doctor`). A file a user could write is ignored."""

from __future__ import annotations

import os
import stat
import tomllib
from collections.abc import Mapping
from typing import Any

from gpuenv.errors import UsageError

SYSTEM_CONFIG = "/etc/gpuenv/config.toml"
SYSTEM_CONFIG_ENV = "GPUENV_SYSTEM_CONFIG"
MAX_CONFIG = 1024 * 1024


def read_system_config(env: Mapping[str, str] | None = None) -> tuple[dict[str, Any] | None, str]:
    """(the config, its path), or (None, why not) when there is none to trust; a file
    that is root's but not valid TOML is a usage error naming it."""
    env = os.environ if env is None else env
    path = env.get(SYSTEM_CONFIG_ENV) or SYSTEM_CONFIG
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None, f"no {path}"
    except OSError as exc:
        return None, f"{path} cannot be read ({exc.strerror})"
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid not in (0, os.getuid()):
            return None, f"{path} is not a file of root's: ignored"
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return None, f"{path} can be written by others: ignored"
        if info.st_size > MAX_CONFIG:
            return None, f"{path} is over {MAX_CONFIG // 1024} KiB: ignored"
        try:
            return tomllib.loads(handle.read(MAX_CONFIG).decode("utf-8")), path
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise UsageError(f"{path} is not valid TOML: {exc}") from None


def seconds(value: object, section: str, key: str, where: str) -> float:
    """A duration: seconds, or '90s', '30m', '2h', '1d'.

    >>> seconds("2h", "idle", "warn_after", "config.toml")
    7200.0
    """
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    if isinstance(value, str) and value[:-1].isdigit() and value[-1:] in units:
        return float(int(value[:-1]) * units[value[-1]])
    raise UsageError(f"{where}: [{section}] {key} = {value!r} is not a duration (e.g. 30m, 2h)")
