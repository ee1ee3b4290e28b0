"""Image references, registry mirrors and registry credentials (no Docker calls).

The lock always keeps the canonical name (``nvcr.io/nvidia/pytorch:24.05-py3``) and
the digest. Where nvcr.io is out of reach (air-gapped clusters, these test machines),
a mirror serves the same repositories: ``nvcr.io/<path>`` is pulled as
``<mirror>/<path>``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpuenv.common.dirs import user_config_file
from gpuenv.common.userconfig import UserConfigError, read_trusted
from gpuenv.engine.failures import NGC_KEY_ENV

NGC_REGISTRY = "nvcr.io"
MIRROR_ENV = "GPUENV_REGISTRY_MIRROR"

_HOST_PORT = re.compile(
    r"^(?:[A-Za-z0-9-]+\.)*[A-Za-z0-9-]+(?::\d{1,5})?$|^\[[0-9a-fA-F:]+\](?::\d{1,5})?$"
)


class InvalidMirror(ValueError):
    """A mirror that is not ``host`` or ``host:port``."""


@dataclass(frozen=True)
class Reference:
    """``repository[:tag][@digest]``, split."""

    repository: str
    tag: str | None = None
    digest: str | None = None

    def __str__(self) -> str:
        text = self.repository
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text

    @property
    def registry(self) -> str:
        first, _, rest = self.repository.partition("/")
        if rest and ("." in first or ":" in first or first == "localhost"):
            return first
        return "docker.io"


def parse_reference(text: str) -> Reference:
    """Split an image reference.

    >>> parse_reference("nvcr.io/nvidia/pytorch:24.05-py3")
    Reference(repository='nvcr.io/nvidia/pytorch', tag='24.05-py3', digest=None)
    >>> parse_reference("127.0.0.1:5000/nvidia/pytorch@sha256:" + "a" * 64).registry
    '127.0.0.1:5000'
    """
    name, _, digest = text.partition("@")
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        return Reference(name[:colon], name[colon + 1 :], digest or None)
    return Reference(name, None, digest or None)


def check_mirror(value: str) -> str:
    value = value.strip().removeprefix("https://").removeprefix("http://").rstrip("/")
    if not _HOST_PORT.match(value):
        raise InvalidMirror(f"'{value}' is not a registry mirror (expected host or host:port)")
    return value


def registry_mirror(env: Mapping[str, str] | None = None) -> tuple[str | None, str]:
    """The mirror for nvcr.io and where it was set; the environment wins over the file."""
    env = os.environ if env is None else env
    if env.get(MIRROR_ENV):
        return check_mirror(env[MIRROR_ENV]), MIRROR_ENV
    path = user_config_file(env)
    try:
        data = read_trusted(path)  # the mounts' rule: the user's (or root's), nobody else's
    except UserConfigError as exc:
        raise InvalidMirror(str(exc)) from None
    value = data.get("registry_mirror") if isinstance(data, dict) else None
    if value is None:
        return None, ""
    if not isinstance(value, str):
        raise InvalidMirror(f"{path}: registry_mirror must be text like 'mirror.example:5000'")
    return check_mirror(value), path


def pull_repository(repository: str, mirror: str | None) -> str:
    """Where to pull a canonical repository from: its mirror for nvcr.io, else itself.

    >>> pull_repository("nvcr.io/nvidia/pytorch", "127.0.0.1:5000")
    '127.0.0.1:5000/nvidia/pytorch'
    >>> pull_repository("nvcr.io/nvidia/pytorch", None)
    'nvcr.io/nvidia/pytorch'
    """
    if mirror and parse_reference(repository).registry == NGC_REGISTRY:
        return mirror + repository[len(NGC_REGISTRY) :]
    return repository


def local_references(image: str, digest: str, mirror: str | None) -> list[str]:
    """The names an engine holds a locked base under once gpuenv pulled it: by digest
    from the mirror (nvcr.io images, where one is set) and from the image's own
    registry; by tag while the lock has no digest yet.

    >>> local_references("nvcr.io/nvidia/pytorch:24.05-py3", "sha256:ab", "127.0.0.1:5000")
    ['127.0.0.1:5000/nvidia/pytorch@sha256:ab', 'nvcr.io/nvidia/pytorch@sha256:ab']
    >>> local_references("nvcr.io/nvidia/pytorch:24.05-py3", "", None)
    ['nvcr.io/nvidia/pytorch:24.05-py3']
    """
    canonical = parse_reference(image)
    repositories = dict.fromkeys(
        [pull_repository(canonical.repository, mirror), canonical.repository]
    )
    if digest:
        return [f"{repository}@{digest}" for repository in repositories]
    return [f"{repository}:{canonical.tag}" for repository in repositories if canonical.tag]


def credentials(repository: str, env: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """NGC's API key as nvcr.io credentials, for nvcr.io only; None lets Docker's own
    stored credentials (docker login) apply."""
    env = os.environ if env is None else env
    key = env.get(NGC_KEY_ENV)
    if key and parse_reference(repository).registry == NGC_REGISTRY:
        return {"username": "$oauthtoken", "password": key, "serveraddress": NGC_REGISTRY}
    return None
