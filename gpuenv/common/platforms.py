"""Image and host platforms in the OCI form (``linux/amd64``, ``linux/arm64``): an amd64
image on an Arm node (a GH200) fails with "exec format error" otherwise."""

from __future__ import annotations

import os

PLATFORMS = ("linux/amd64", "linux/arm64")
_MACHINES = {
    "x86_64": "linux/amd64",
    "amd64": "linux/amd64",
    "aarch64": "linux/arm64",
    "arm64": "linux/arm64",
}
# What `uname -m` prints on a node of each platform (for the batch scripts' check).
UNAME = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}


def platform_of_machine(machine: str) -> str | None:
    """``x86_64`` -> ``linux/amd64``; None for a machine gpuenv has no images for.

    >>> platform_of_machine("aarch64")
    'linux/arm64'
    """
    return _MACHINES.get(machine.strip().lower())


def this_platform() -> str | None:
    """The platform of this machine (os.uname, not the slower `platform` module)."""
    return platform_of_machine(os.uname().machine)


def arch_of(platform: str) -> str:
    """``linux/arm64`` -> ``arm64`` (Kubernetes' kubernetes.io/arch label value)."""
    return platform.split("/", 1)[1]
