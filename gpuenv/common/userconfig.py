"""gpuenv's user config file: GPUENV_CONFIG, else $XDG_CONFIG_HOME/gpuenv/config.yaml
(~/.config/gpuenv/config.yaml), and the rule every settings file that points gpuenv at
a registry, an index or a path is read with (the config, the matrix overlay): only its
owner decides what it says, so a file another user could write is refused, since it
widens what a spec may mount or changes which images and registries are used."""

from __future__ import annotations

import errno
import os
import stat
from typing import Any

import yaml

from gpuenv.common import nesting


class UserConfigError(ValueError):
    """The user config file cannot be read or is not trustworthy."""


MAX_SETTINGS = 16 * 1024 * 1024  # a config or a matrix overlay, never a FIFO or a huge file


def read_owned(path: str, what: str) -> bytes | None:
    """A settings file's bytes (None when there is none), read with the ownership rule
    every setting that points gpuenv at a registry, an index or a path follows: a regular
    file (never through a link, never a FIFO) that the reader or root owns and that
    nobody else may write, as ssh refuses such a config. UserConfigError otherwise (the
    OSError of a file that cannot be opened, such as one of another user's, as it is)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UserConfigError(
                f"{path}: {what} is a symbolic link, which gpuenv does not follow for a "
                "setting (fix: put the file itself there)"
            ) from None
        raise
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise UserConfigError(f"{path}: {what} is not a regular file")
        if info.st_uid not in (os.getuid(), 0):
            raise UserConfigError(
                f"{path}: another user owns it, so gpuenv does not trust it "
                f"(fix: chown $USER {path}, or root's)"
            )
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise UserConfigError(
                f"{path}: others may write it, so gpuenv does not trust it (fix: chmod go-w {path})"
            )
        if info.st_size > MAX_SETTINGS:
            raise UserConfigError(f"{path}: {what} is over {MAX_SETTINGS >> 20} MiB")
        return handle.read(MAX_SETTINGS + 1)


def read_trusted(path: str) -> dict[str, Any]:
    """The user config's mapping ({} when there is none), by `read_owned`'s rule."""
    try:
        raw = read_owned(path, "the gpuenv config")
    except OSError as exc:
        raise UserConfigError(f"{path}: cannot read the gpuenv config ({exc.strerror})") from None
    if raw is None:
        return {}
    try:
        data = nesting.loads(yaml.safe_load, raw.decode("utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError, nesting.TooDeep) as exc:
        raise UserConfigError(f"{path}: cannot read the gpuenv config ({exc})") from None
    if not isinstance(data, dict):
        raise UserConfigError(f"{path}: expected a mapping of settings")
    return data
