"""gpuenv's user config file: GPUENV_CONFIG, else $XDG_CONFIG_HOME/gpuenv/config.yaml
(~/.config/gpuenv/config.yaml). Only its owner decides what it says: a file another
user could write is refused, since it widens what a spec may mount."""

from __future__ import annotations

import os
import stat
from typing import Any

import yaml


class UserConfigError(ValueError):
    """The user config file cannot be read or is not trustworthy."""


def read_trusted(path: str) -> dict[str, Any]:
    """The file's mapping ({} when there is none); refused when another user owns it or
    may write it (as ssh refuses such a config)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise UserConfigError(f"{path}: cannot read the gpuenv config ({exc.strerror})") from None
    with os.fdopen(fd, encoding="utf-8") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise UserConfigError(f"{path}: not a regular file")
        if info.st_uid not in (os.getuid(), 0) or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise UserConfigError(
                f"{path}: another user owns it or may write it, so gpuenv does not trust it "
                f"(fix: chown $USER {path}; chmod go-w {path})"
            )

        try:
            data = yaml.safe_load(handle) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise UserConfigError(f"{path}: cannot read the gpuenv config ({exc})") from None
    if not isinstance(data, dict):
        raise UserConfigError(f"{path}: expected a mapping of settings")
    return data
