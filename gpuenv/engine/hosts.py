"""Where the engine is, which engine it is (Docker or Podman), and the one translation of
"cannot talk to it"."""

from __future__ import annotations

import os
from collections.abc import Mapping

from gpuenv.errors import EngineError, GpuenvError, UsageError

DEFAULT_HOST = "unix:///var/run/docker.sock"
ENGINE_ENV = "GPUENV_ENGINE"  # docker | podman
PODMAN_ROOTFUL_SOCKET = "unix:///run/podman/podman.sock"


def docker_host(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get("DOCKER_HOST") or DEFAULT_HOST


def podman_socket(env: Mapping[str, str]) -> str:
    """Podman's API socket: CONTAINER_HOST, DOCKER_HOST, else the one of `podman system
    service` for this user (rootless: $XDG_RUNTIME_DIR/podman/podman.sock)."""
    for name in ("CONTAINER_HOST", "DOCKER_HOST"):
        if env.get(name):
            return env[name]
    runtime = env.get("XDG_RUNTIME_DIR")
    if os.getuid() != 0 and runtime:
        return f"unix://{runtime}/podman/podman.sock"
    return PODMAN_ROOTFUL_SOCKET


def engine_choice(env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(docker|podman, address): GPUENV_ENGINE when set; else Podman when the socket in
    DOCKER_HOST is a podman.sock or only CONTAINER_HOST (Podman's own variable) is set.

    >>> engine_choice({"DOCKER_HOST": "unix:///run/user/1000/podman/podman.sock"})
    ('podman', 'unix:///run/user/1000/podman/podman.sock')
    >>> engine_choice({})
    ('docker', 'unix:///var/run/docker.sock')
    """
    env = os.environ if env is None else env
    chosen = env.get(ENGINE_ENV, "").strip().lower()
    if chosen not in ("", "docker", "podman"):
        raise UsageError(f"{ENGINE_ENV}={chosen}: not docker or podman")
    for name in ("DOCKER_HOST", "CONTAINER_HOST"):
        _known_scheme(name, env.get(name, ""))
    if chosen == "podman":
        return "podman", podman_socket(env)
    if chosen == "docker":
        return "docker", docker_host(env)
    if env.get("DOCKER_HOST"):
        host = env["DOCKER_HOST"]
        return ("podman" if "podman" in host.rsplit("/", 1)[-1] else "docker"), host
    if env.get("CONTAINER_HOST"):
        return "podman", env["CONTAINER_HOST"]
    return "docker", DEFAULT_HOST


SCHEMES = ("unix", "tcp", "ssh", "http", "https")  # what docker-py and the docker CLI take


def _known_scheme(name: str, address: str) -> None:
    """UsageError (exit 2) for an engine address gpuenv cannot use, before any call.

    >>> _known_scheme("DOCKER_HOST", "foo://bar")
    Traceback (most recent call last):
    ...
    gpuenv.errors.UsageError: DOCKER_HOST=foo://bar: 'foo' is not an engine address gpuenv can use
    """
    if not address:
        return
    scheme, found, _ = address.partition("://")
    if not found or scheme.lower() not in SCHEMES:
        shown = scheme if found else address
        raise UsageError(
            f"{name}={address}: {shown!r} is not an engine address gpuenv can use",
            hint="write unix:///path/to/docker.sock, tcp://HOST:2376 or ssh://USER@HOST, as "
            "the docker CLI takes them (or unset it for the local engine)",
        )


def not_running(host: str, product: str = "Docker") -> EngineError:
    if product == "Podman":
        return EngineError(
            f"cannot reach the Podman service at {host}: is it running?",
            hint="start it: `systemctl --user start podman.socket` (rootless), `sudo systemctl "
            "start podman.socket`, or `podman system service --time=0 &`; or point "
            "CONTAINER_HOST at its socket",
        )
    return EngineError(
        f"cannot reach the Docker engine at {host}: is it running?",
        hint="start it (`sudo systemctl start docker`, or `sudo dockerd &`), "
        "or point DOCKER_HOST at a running engine",
    )


def engine_error(exc: BaseException, host: str) -> GpuenvError:
    """The one translation of "cannot talk to the engine" into what to do next."""
    text = str(exc)
    podman = "podman" in host
    product = "Podman service" if podman else "Docker engine"
    if host.startswith("ssh://") and any(
        word in text.lower()
        for word in ("permission denied (publickey", "authentication fail", "host key verification")
    ):
        return EngineError(
            f"SSH to the {product} at {host} failed: {text}",
            hint="make `ssh HOST` work without a password first (a key in your ssh-agent, "
            "the host in ~/.ssh/known_hosts), then try again",
        )
    if isinstance(exc, PermissionError) or "Permission denied" in text:
        where = host.removeprefix("unix://")
        if podman:
            return EngineError(
                f"permission denied on the Podman socket {where}",
                hint="use your own rootless Podman service (`systemctl --user start "
                "podman.socket`, CONTAINER_HOST=unix://$XDG_RUNTIME_DIR/podman/podman.sock)",
            )
        return EngineError(
            f"permission denied on the Docker socket {where}",
            hint="add yourself to the docker group (`sudo usermod -aG docker $USER`, then log "
            "in again), or use rootless Docker",
        )
    if "timed out" in text.lower():
        return EngineError(
            f"the {product} at {host} did not answer in time",
            hint=(
                "restart it (`systemctl --user restart podman.socket`, or the system's "
                "`sudo systemctl restart podman.socket`)"
                if podman
                else "restart it (`sudo systemctl restart docker`)"
            )
            + ", or give it more time: GPUENV_ENGINE_TIMEOUT=SECONDS",
        )
    if any(word in text for word in ("SSL", "TLS", "certificate")):
        return EngineError(
            f"TLS with the {product} at {host} failed: {text}",
            hint="check DOCKER_CERT_PATH (ca.pem, cert.pem, key.pem) and DOCKER_TLS_VERIFY, "
            "which gpuenv reads as the docker CLI does",
        )
    return not_running(host, "Podman" if podman else "Docker")
