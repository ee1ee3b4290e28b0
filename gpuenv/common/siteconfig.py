"""The host-wide config file (`/etc/gpuenv/config.toml`, or GPUENV_SYSTEM_CONFIG): the
admin's settings ([idle] for `gpuenv idle --enforce`, [history] for the dashboard's
sampler, [dcgm_exporter] for the job mapping), trusted only when root (or the reader
itself) owns it and nobody else can write it, since it says what gpuenv does to other
users' runs."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuenv.common import nesting
from gpuenv.errors import UsageError

SYSTEM_CONFIG = "/etc/gpuenv/config.toml"
SYSTEM_CONFIG_ENV = "GPUENV_SYSTEM_CONFIG"
MAX_CONFIG = 1024 * 1024  # no wait on a FIFO, no reading a huge file: it is a config


@dataclass(frozen=True)
class SiteConfig:
    """The file's tables (None when it is missing or not trusted, `why` says which)."""

    path: str
    data: dict[str, Any] | None
    why: str = ""
    missing: bool = False


def read_site_config(env: Mapping[str, str] | None = None) -> SiteConfig:
    """The host-wide config; a trusted file that is not valid TOML is a usage error."""
    import tomllib  # only where a command reads the file

    env = os.environ if env is None else env
    path = env.get(SYSTEM_CONFIG_ENV) or SYSTEM_CONFIG
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return SiteConfig(path, None, f"no {path}", missing=True)
    except OSError as exc:
        return SiteConfig(path, None, f"{path} cannot be read ({exc.strerror})")
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid not in (0, os.getuid()):
            return SiteConfig(path, None, f"{path} is not a file of root's: ignored")
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return SiteConfig(path, None, f"{path} can be written by others: ignored")
        if info.st_size > MAX_CONFIG:
            return SiteConfig(path, None, f"{path} is over {MAX_CONFIG // 1024} KiB: ignored")
        try:
            data = nesting.loads(tomllib.loads, handle.read(MAX_CONFIG).decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError, nesting.TooDeep) as exc:
            raise UsageError(f"{path} is not valid TOML: {exc}") from None
    return SiteConfig(path, data)


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
