"""Published ports: `ports:` in gpuenv.yaml and `-p/--publish` on run and shell.

``[IP:][HOST:]CONTAINER[/tcp|/udp]``, as `docker run -p` writes them, with two
differences that matter on a shared server: without an address a port is published on
127.0.0.1 only (Docker's default is every interface), and a host port of 0, or none,
lets the engine pick a free one, which gpuenv then prints as a URL.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

LOOPBACK = "127.0.0.1"
ALL_INTERFACES = ("0.0.0.0", "::")
_FORM = re.compile(
    r"^(?:(?P<address>\[[0-9a-fA-F:.]+\]|\d{1,3}(?:\.\d{1,3}){3}):)?(?:(?P<host>\d{0,5}):)?"
    r"(?P<container>\d{1,5})(?:/(?P<protocol>tcp|udp))?$"
)


@dataclass(frozen=True)
class Port:
    """One published port: the host side (address and port, 0 for a free one) and the
    container's port."""

    container: int
    host: int = 0
    address: str = LOOPBACK
    protocol: str = "tcp"

    @property
    def key(self) -> str:
        """How the Engine API names the container's side: ``8000/tcp``."""
        return f"{self.container}/{self.protocol}"

    @property
    def everywhere(self) -> bool:
        """Published on every interface of the host: anyone who reaches it connects."""
        return self.address in ALL_INTERFACES

    def __str__(self) -> str:
        address = f"[{self.address}]" if ":" in self.address else self.address
        suffix = "" if self.protocol == "tcp" else f"/{self.protocol}"
        return f"{address}:{self.host}:{self.container}{suffix}"

    def url(self) -> str:
        """Where a browser reaches it (a tcp port whose host port is known)."""
        address = "127.0.0.1" if self.address == "0.0.0.0" else self.address
        address = "[::1]" if address == "::" else address
        address = f"[{address}]" if ":" in address and not address.startswith("[") else address
        return f"http://{address}:{self.host}/"


def parse_port(value: Any) -> Port:
    """`8888`, `"8888"`, `"0:8888"`, `"9000:8888"`, `"0.0.0.0:9000:8888"`,
    `"[::1]:0:8888/udp"`; ValueError saying what is wrong, with the form.

    >>> parse_port("8888")
    Port(container=8888, host=0, address='127.0.0.1', protocol='tcp')
    >>> str(parse_port("0.0.0.0:9000:8888"))
    '0.0.0.0:9000:8888'
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError("write a port as CONTAINER, HOST:CONTAINER or IP:HOST:CONTAINER")
    text = str(value).strip()
    match = _FORM.match(text)
    if match is None:
        raise ValueError(
            f"'{text}' is not a port to publish: write CONTAINER, HOST:CONTAINER or "
            "IP:HOST:CONTAINER (8888, 0:8888, 127.0.0.1:9000:8888)"
        )
    container = int(match.group("container"))
    host = int(match.group("host") or 0)
    if not 1 <= container <= 65535:
        raise ValueError(f"'{text}': the container's port must be 1 to 65535")
    if host > 65535:
        raise ValueError(f"'{text}': the host's port must be 0 (a free one) to 65535")
    address = (match.group("address") or LOOPBACK).strip("[]")
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        raise ValueError(f"'{text}': {address} is not an IP address") from None
    if parsed.is_multicast:
        raise ValueError(f"'{text}': {address} is a multicast address")
    return Port(container, host, str(parsed), match.group("protocol") or "tcp")


def merged(spec_ports: Iterable[Port], asked: Iterable[Port]) -> tuple[Port, ...]:
    """The spec's ports, with those asked on the command line over them (the same
    container port and protocol: the command line's wins), in order."""
    out: dict[str, Port] = {port.key: port for port in spec_ports}
    for port in asked:
        out[port.key] = port
    return tuple(out.values())


def engine_ports(ports: Sequence[Port]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Engine API's ExposedPorts and HostConfig.PortBindings for `ports` (a host
    port of 0 is sent empty: the engine picks a free one)."""
    exposed: dict[str, Any] = {}
    bindings: dict[str, list[dict[str, str]]] = {}
    for port in ports:
        exposed[port.key] = {}
        bindings.setdefault(port.key, []).append(
            {"HostIp": port.address, "HostPort": str(port.host) if port.host else ""}
        )
    return exposed, bindings


def published(network_ports: Mapping[str, Any] | None) -> list[Port]:
    """What the engine published, from a container's NetworkSettings.Ports
    (``{"8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": "49153"}]}``)."""
    out = []
    for key, bindings in sorted((network_ports or {}).items()):
        number, _, protocol = str(key).partition("/")
        for binding in bindings or []:
            host = str(binding.get("HostPort") or "")
            if number.isdigit() and host.isdigit():
                address = str(binding.get("HostIp") or "") or "0.0.0.0"
                out.append(Port(int(number), int(host), address, protocol or "tcp"))
    return out


def listed(ports: Sequence[Mapping[str, Any]] | None) -> list[Port]:
    """What a container list (GET /containers/json) says it publishes: its ``Ports``
    (Docker: IP, PrivatePort, PublicPort, Type; Podman's compat API alike)."""
    out = []
    for item in ports or []:
        public, private = item.get("PublicPort"), item.get("PrivatePort")
        if isinstance(public, int) and isinstance(private, int) and public:
            address = str(item.get("IP") or "") or "0.0.0.0"
            out.append(Port(private, public, address, str(item.get("Type") or "tcp")))
    return out
