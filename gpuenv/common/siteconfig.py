"""The host-wide config file (`/etc/gpuenv/config.toml`, or GPUENV_SYSTEM_CONFIG): the
admin's settings ([idle] for `gpuenv idle --enforce`, [history] for the dashboard's
sampler, [dcgm_exporter] for the job mapping), trusted only when root (or the reader
itself) owns it and nobody else can write it, since it says what gpuenv does to other
users' runs: the rule every settings file is read with (`userconfig.read_owned`); one
that breaks it is ignored, and said so."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuenv.common import nesting
from gpuenv.common.userconfig import UserConfigError, read_owned
from gpuenv.errors import UsageError

SYSTEM_CONFIG = "/etc/gpuenv/config.toml"
SYSTEM_CONFIG_ENV = "GPUENV_SYSTEM_CONFIG"


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
        raw = read_owned(path, "the site config")
    except UserConfigError as exc:
        return SiteConfig(path, None, f"{exc}: ignored")
    except OSError as exc:
        return SiteConfig(path, None, f"{path} cannot be read ({exc.strerror})")
    if raw is None:
        return SiteConfig(path, None, f"no {path}", missing=True)
    try:
        data = nesting.loads(tomllib.loads, raw.decode("utf-8"))
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
