"""Podman, rootful or rootless, through its Docker-compatible API, except one call.

Containers are created through the libpod API (``POST /libpod/containers/create``)
because the compatible API ignores ``DeviceRequests`` before Podman 5.4 (containers/podman
#22645, docker-py#3182) and does not resolve CDI names in ``HostConfig.Devices`` (Debian
12's 4.3.1: "stat nvidia.com/gpu=…: no such file or directory"); libpod's
SpecGenerator takes CDI names as devices and the user namespace mode. Everything else
(attach, start, wait, signals, archives, lists, images, builds) is the compatible API,
through the Docker adapter (`engine.dockerpy`) this one extends. The API version is
fixed, not negotiated (see `PodmanEngine.api_version`).

Rootless Podman maps the invoking user to root in its user namespace; a container that
runs as the user gets ``--userns=keep-id`` so that files written in the project stay the
user's on the host.
"""

from __future__ import annotations

import os
import resource
import socket
import struct
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from gpuenv.engine.dockerpy import TIMEOUT, DockerEngine, quick_timeout
from gpuenv.engine.hosts import podman_socket
from gpuenv.engine.protocol import BuildCache, Builder, ImageInfo
from gpuenv.errors import GpuRuntimeMissing

LIBPOD = "/v4.0.0/libpod"  # Podman >= 4.0 (the API version is in the path)
COMPATIBLE_API = "1.41"  # the Docker API version of Podman 4's compatible API
RLIMIT_DEFAULT = 1048576  # what rootful Podman gives nofile and nproc by default
RLIM_INFINITY = 2**64 - 1  # libpod's rlimits are unsigned: -1 is "unlimited"
CAP_SYS_RESOURCE = 24  # linux/capability.h: may raise a hard rlimit
# /proc/PID/limits' rows for the rlimits a run names, by libpod's name
LIMIT_ROWS = {
    "nofile": "Max open files",
    "nproc": "Max processes",
    "memlock": "Max locked memory",
    "stack": "Max stack size",
}


def docker_name(reference: str) -> str:
    """``docker.io/gpuenv/p:1`` -> ``gpuenv/p:1``; ``docker.io/library/x`` -> ``x``.

    >>> docker_name("docker.io/library/debian:12"), docker_name("127.0.0.1:5000/a/b:1")
    ('debian:12', '127.0.0.1:5000/a/b:1')
    """
    name = reference.removeprefix("docker.io/")
    return name.removeprefix("library/") if name != reference else reference


def _limit(value: int) -> int:
    return RLIM_INFINITY if value < 0 else value


def service_limits(socket_path: str) -> dict[str, int] | None:
    """The hard rlimits of the process serving `socket_path` when it cannot raise them
    (not root, or root without CAP_SYS_RESOURCE: a container cannot get more than they
    are, and runc fails with "error setting rlimit"); {} when it can raise them; None when
    that cannot be known (another machine, a /proc this user cannot read, a socket that
    systemd made). The process is the socket's peer (SO_PEERCRED)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(2)
            probe.connect(socket_path)
            peer = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, _ = struct.unpack("3i", peer)
        if pid <= 1:  # systemd's socket, not the service's
            return None
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as handle:
            status = dict(line.partition(":")[::2] for line in handle.read().splitlines())
        with open(f"/proc/{pid}/limits", encoding="ascii", errors="replace") as handle:
            rows = handle.read().splitlines()
    except (OSError, struct.error):
        return None
    effective = int(status.get("CapEff", "0").strip() or "0", 16)
    if uid == 0 and effective >> CAP_SYS_RESOURCE & 1:
        return {}
    limits = {}
    for name, row in LIMIT_ROWS.items():
        words = next((r[len(row) :].split() for r in rows if r.startswith(row)), [])
        if len(words) >= 2:
            limits[name] = RLIM_INFINITY if words[1] == "unlimited" else int(words[1])
    return limits


def libpod_spec(
    config: Mapping[str, Any], *, rootless: bool, limits: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """The libpod SpecGenerator for an Engine API create body (the fields gpuenv sets).
    `limits`: what `service_limits` read of the service."""
    host = config.get("HostConfig") or {}
    env = dict(e.split("=", 1) for e in config.get("Env") or () if "=" in e)
    spec: dict[str, Any] = {
        "image": config["Image"],
        "command": list(config.get("Cmd") or ()),
        "env": env,
        "labels": dict(config.get("Labels") or {}),
        "terminal": bool(config.get("Tty")),
        "stdin": bool(config.get("OpenStdin")),
        "init": bool(host.get("Init")),
        "no_new_privileges": "no-new-privileges" in (host.get("SecurityOpt") or ()),
    }
    if config.get("Entrypoint") is not None:
        spec["entrypoint"] = list(config["Entrypoint"])
    if config.get("WorkingDir"):
        spec["work_dir"] = config["WorkingDir"]
    user = str(config.get("User") or "")
    if user:
        spec["user"] = user
    if rootless and user and user.split(":")[0] not in ("0", "root"):
        spec["userns"] = {"nsmode": "keep-id"}
    optional = {
        "mounts": _mounts(host),
        "r_limits": _rlimits(host, limits),
        "ipcns": {"nsmode": host["IpcMode"]} if host.get("IpcMode") else None,
        "shm_size": int(host["ShmSize"]) if host.get("ShmSize") else None,
        "resource_limits": (
            {"memory": {"limit": int(host["Memory"])}} if host.get("Memory") else None
        ),
        "devices": _devices(host),
        "portmappings": _ports(host),
    }
    spec.update({key: value for key, value in optional.items() if value})
    return spec


def _ports(host: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The published ports (the Engine API's PortBindings) as libpod's port mappings; a
    host port of 0 lets Podman pick a free one, as Docker does.

    >>> _ports({"PortBindings": {"8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": "0"}]}})
    [{'container_port': 8000, 'host_port': 0, 'host_ip': '127.0.0.1', 'protocol': 'tcp'}]
    """
    mappings = []
    for key, bindings in (host.get("PortBindings") or {}).items():
        port, _, protocol = str(key).partition("/")
        for binding in bindings or ():
            mappings.append(
                {
                    "container_port": int(port),
                    "host_port": int(binding.get("HostPort") or 0),
                    "host_ip": str(binding.get("HostIp") or ""),
                    "protocol": protocol or "tcp",
                }
            )
    return mappings


def _mounts(host: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "destination": mount["Target"],
            "source": mount["Source"],
            "type": "bind",
            "options": ["rbind"] + (["ro"] if mount.get("ReadOnly") else []),
        }
        for mount in host.get("Mounts") or ()
    ]


def _rlimits(host: Mapping[str, Any], service: Mapping[str, int] | None) -> list[dict[str, Any]]:
    """The create body's rlimits, each at most what the service may grant. A spec that
    names any rlimit gets nofile and nproc of 1048576 from rootful Podman unless it names
    them too (podman pkg/specgen/generate/oci.go addRlimits), which a service that cannot
    raise its own limits refuses. So: a service that can raise them is left to choose
    them; one that cannot gets its own hard limits named; where that is not known, this
    process's own limits are named (a service on this machine usually has them)."""
    limits: list[dict[str, Any]] = [
        {"type": str(u["Name"]).lower(), "soft": _limit(u["Soft"]), "hard": _limit(u["Hard"])}
        for u in host.get("Ulimits") or ()
    ]
    if not limits:
        return []
    if service is None:
        service = {}
        for name, number in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
            _, hard = resource.getrlimit(number)
            service[name] = RLIMIT_DEFAULT if hard == resource.RLIM_INFINITY else hard
    for limit in limits:
        cap = service.get(limit["type"])
        if cap is not None:
            limit["hard"] = min(limit["hard"], cap)
            limit["soft"] = min(limit["soft"], limit["hard"])
    named = {limit["type"] for limit in limits}
    for name in ("nofile", "nproc"):
        if name not in named and name in service:
            hard = min(service[name], RLIMIT_DEFAULT)
            limits.append({"type": name, "soft": hard, "hard": hard})
    return limits


def _devices(host: Mapping[str, Any]) -> list[dict[str, str]]:
    """The CDI devices of the create body's device requests (Podman takes no other)."""
    devices = []
    for request in host.get("DeviceRequests") or ():
        if request.get("Driver") != "cdi":
            raise GpuRuntimeMissing(
                "Podman takes GPUs only through CDI devices, not the NVIDIA device request",
                hint="unset GPUENV_GPU_PATH=legacy, and give Podman a CDI spec "
                "(`sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`)",
            )
        devices += [{"path": name} for name in request.get("DeviceIDs") or ()]
    return devices


class PodmanEngine(DockerEngine):
    """The Engine protocol for Podman's API socket (``podman system service``)."""

    # Not negotiated: Podman 4.3 answers /version in about a second (it asks conmon and
    # the runtime for theirs); its compatible API is Docker's 1.41.
    api_version = COMPATIBLE_API

    def __init__(self, host: str | None = None) -> None:
        super().__init__(host or podman_socket(os.environ))
        self._rootless: bool | None = None

    @property
    def rootless(self) -> bool:
        """Whether the service runs rootless: its socket belongs to a user, not root
        (a rootless service runs as its user; libpod's /info says the same, slowly)."""
        if self._rootless is None:
            try:
                self._rootless = os.stat(self.host.removeprefix("unix://")).st_uid != 0
            except OSError:
                security = (self._libpod_info().get("host") or {}).get("security") or {}
                self._rootless = bool(security.get("rootless"))
        return self._rootless

    def _libpod_info(self) -> dict[str, Any]:
        with self._calls():
            response = self.quick.get(f"{self.api.base_url}{LIBPOD}/info", timeout=quick_timeout())
            return dict(self._checked(response).json())

    @property
    def builder(self) -> Builder:
        """Podman builds with buildah, through its compatible /build: RUN --mount works
        (cache mounts, binds of another stage), and the messages are the classic ones."""
        return "buildah"

    def build_caches(self) -> list[BuildCache] | None:
        """None: buildah keeps cache mounts in folders on the Podman host
        (``/var/tmp/buildah-cache``), and Podman's API neither lists nor removes them."""
        return None

    def remove_build_caches(self, ids: Sequence[str]) -> int:
        return 0

    def version(self) -> dict[str, Any]:
        """The version from ``GET /_ping``'s headers (Libpod-Api-Version, Api-Version),
        with ``Rootless``: Podman 4.3 answers /version in about a second, /_ping in
        milliseconds, and a run needs it."""
        with self._calls():
            response = self.quick.get(f"{self.api.base_url}/_ping", timeout=quick_timeout())
            headers = self._checked(response).headers
        libpod = headers.get("Libpod-Api-Version", "")
        if not libpod:
            return super().version()
        return {
            "Version": libpod,
            "ApiVersion": headers.get("Api-Version") or COMPATIBLE_API,
            "Components": [{"Name": "Podman Engine", "Version": libpod}],
            "Rootless": self.rootless,
        }

    def info(self) -> dict[str, Any]:
        """The compatible /info, with ``name=rootless`` among the SecurityOptions when the
        service is rootless (as Docker's rootless daemon reports it)."""
        result = super().info()
        security = list(result.get("SecurityOptions") or ())
        if self.rootless and not any("rootless" in s for s in security):
            result["SecurityOptions"] = [*security, "name=rootless"]
        return result

    def images(self, label: str | None = None) -> list[ImageInfo]:
        """As Docker names them: Podman qualifies a name without a registry with
        docker.io (``docker.io/gpuenv/p:1``), Docker shows ``gpuenv/p:1``."""
        return [
            replace(image, tags=tuple(docker_name(tag) for tag in image.tags))
            for image in super().images(label)
        ]

    def create(self, config: Mapping[str, Any], name: str | None = None) -> str:
        local = self.host.startswith("unix://")
        limits = service_limits(self.host.removeprefix("unix://")) if local else None
        spec = libpod_spec(config, rootless=self.rootless, limits=limits)
        if name:  # libpod's SpecGenerator names the container in the body, not the query
            spec["name"] = name
        url = f"{self.api.base_url}{LIBPOD}/containers/create"
        with self._calls():
            response = self.api.post(url, json=spec, timeout=TIMEOUT)
            return str(self._checked(response).json()["Id"])
