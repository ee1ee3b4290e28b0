"""Who a run is inside the container, and the image's accounts for it.

A run's command runs as the invoking user, by number (the engine's `User` is always
uid:gid). So that the user also has a name and a HOME there, the image's /etc/passwd
and /etc/group get an entry for them, and /home/NAME is made, owned by them. The image's
own files are read once per build (`image_accounts`); and `account_image` makes, once
per build and user, a child of the image with exactly those three additions (one layer
of a few KB, committed from a container that is never started), so that a run as that
user uploads nothing: an upload (PUT /archive) is the slowest step of a run, as the
engine unpacks it in a helper process of its own. A run checks the child's labels
(made for this uid, gid and name, from this image) before it uses it, and otherwise
uploads the entries into its own container as before.
"""

from __future__ import annotations

import contextlib
import io
import os
import pwd
import re
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuenv.common.files import file_from_archive
from gpuenv.common.labels import LABEL_PREFIX
from gpuenv.engine.protocol import Engine
from gpuenv.errors import GpuenvError

ACCOUNT_LABEL = f"{LABEL_PREFIX}.account"  # uid:gid:name of the user it has the account of
ACCOUNT_BASE_LABEL = f"{LABEL_PREFIX}.account-base"  # the image it was made from
# Patterns as text: re compiles (and keeps) each on its first use, not at import.
_USER_NAME = r"^[a-z_][a-z0-9_-]{0,31}$"


@dataclass(frozen=True)
class Identity:
    """Who the command runs as inside the container: the invoking user, by number."""

    uid: int
    gid: int
    name: str

    @property
    def home(self) -> str:
        return f"/home/{self.name}"

    @property
    def key(self) -> str:
        """How an account image names the user it was made for.

        >>> Identity(1000, 1000, "alice").key
        '1000:1000:alice'
        """
        return f"{self.uid}:{self.gid}:{self.name}"


def invoking_identity() -> Identity:
    uid, gid = os.getuid(), os.getgid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = os.environ.get("USER", "")
    return Identity(uid, gid, name if re.match(_USER_NAME, name or "") else "gpuenv")


def merge_accounts(passwd: str, group: str, identity: Identity) -> tuple[str, str]:
    """The image's /etc/passwd and /etc/group, plus the invoking user if its ids are new."""

    def has_id(text: str, field: int, value: int) -> bool:
        for line in text.splitlines():
            parts = line.split(":")
            if len(parts) > field and parts[field] == str(value):
                return True
        return False

    if not has_id(passwd, 2, identity.uid):
        passwd = (
            passwd.rstrip("\n")
            + f"\n{identity.name}:x:{identity.uid}:{identity.gid}::{identity.home}:/bin/bash\n"
        )
    if not has_id(group, 2, identity.gid):
        group = group.rstrip("\n") + f"\n{identity.name}:x:{identity.gid}:\n"
    return passwd.lstrip("\n"), group.lstrip("\n")


def accounts_archive(passwd: str, group: str, identity: Identity) -> bytes:
    """A tar for PUT /archive at /: etc/passwd, etc/group and the user's (empty) home."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, text in (("etc/passwd", passwd), ("etc/group", group)):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            archive.addfile(info, io.BytesIO(data))
        home = tarfile.TarInfo(identity.home.lstrip("/"))
        home.type, home.mode = tarfile.DIRTYPE, 0o755
        home.uid, home.gid = identity.uid, identity.gid
        archive.addfile(home)
    return buffer.getvalue()


def image_accounts(engine: Engine, tag: str) -> tuple[str, str] | None:
    """The image's /etc/passwd and /etc/group, read from a container that is created and
    removed, never started: a run then adds its user with one upload. None when the
    engine cannot say."""
    try:
        # An image without a command cannot be created; this one is never started.
        probe = {
            "Image": tag,
            "Entrypoint": ["/gpuenv-accounts-probe-never-started"],
            "Cmd": [],
            "Labels": {"io.gpuenv.probe": "accounts"},
        }
        container = engine.create(probe)
    except GpuenvError:
        return None
    try:
        # One after the other: Docker reads a container's files one request at a time
        # (asked at once, the two took as long as in turn).
        passwd = file_from_archive(engine.get_archive(container, "/etc/passwd"))
        group = file_from_archive(engine.get_archive(container, "/etc/group"))
    except GpuenvError:
        return None
    finally:
        with contextlib.suppress(GpuenvError):
            engine.remove(container)
    return passwd, group


def account_tag(tag: str, identity: Identity) -> str:
    """
    >>> account_tag("gpuenv/demo:0123456789abcdef", Identity(1000, 100, "alice"))
    'gpuenv/demo:0123456789abcdef-u1000'
    """
    return f"{tag}-u{identity.uid}"


def account_image(
    engine: Engine, tag: str, identity: Identity, accounts: tuple[str, str]
) -> str | None:
    """Make the child of `tag` with the user's account in it (see the module docstring);
    its tag, or None when the engine cannot (a run then uploads the entries itself).

    The container it is committed from keeps the image's entrypoint (the commit keeps
    it too) and is never started; the child's command is the image's (a run always
    names its own), its labels the image's plus the two account labels.
    """
    config = engine.image_config(tag)
    if config is None:
        return None
    labels = {
        **(config.get("Labels") or {}),
        ACCOUNT_LABEL: identity.key,
        ACCOUNT_BASE_LABEL: tag,
    }
    target = account_tag(tag, identity)
    repository, _, version = target.rpartition(":")
    try:
        container = engine.create(
            {"Image": tag, "Cmd": list(config.get("Cmd") or ["true"]), "Labels": labels}
        )
    except GpuenvError:
        return None
    try:
        passwd, group = merge_accounts(*accounts, identity)
        engine.put_archive(container, "/", accounts_archive(passwd, group, identity))
        commit: dict[str, Any] = {"Labels": labels}
        if config.get("Cmd"):
            commit["Cmd"] = list(config["Cmd"])
        engine.commit(container, repository, version, commit)
    except GpuenvError:
        return None
    finally:
        with contextlib.suppress(GpuenvError):
            engine.remove(container)
    return target


def usable_account_image(
    engine: Engine, recorded: Mapping[str, Any] | None, tag: str, identity: Identity | None
) -> str | None:
    """The account image recorded for this build, if it was made for exactly this user
    from exactly this image and the engine has it (one request); else None."""
    if identity is None or not isinstance(recorded, Mapping):
        return None
    target = recorded.get("tag")
    if recorded.get("for") != identity.key or target != account_tag(tag, identity):
        return None
    config = engine.image_config(str(target))
    labels = (config or {}).get("Labels") or {}
    if labels.get(ACCOUNT_LABEL) != identity.key or labels.get(ACCOUNT_BASE_LABEL) != tag:
        return None
    return str(target)
