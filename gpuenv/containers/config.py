"""What a `gpuenv run` container is: command, identity, environment, GPUs, mounts, limits.

Decided here, as data (the Engine API's create body); `session` runs it. Nothing here
talks to the engine.
"""

from __future__ import annotations

import os
import posixpath
import re
import resource
import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any

from gpuenv.common.labels import DETACHED_LABEL, RUN_LABEL
from gpuenv.containers.devices import LEGACY
from gpuenv.containers.devices import device_requests as requests_for
from gpuenv.errors import UsageError
from gpuenv.host.procfs import process_start
from gpuenv.images.accounts import Identity as Identity
from gpuenv.images.accounts import accounts_archive as accounts_archive
from gpuenv.images.accounts import invoking_identity as invoking_identity
from gpuenv.images.accounts import merge_accounts as merge_accounts
from gpuenv.project.mounts import Bind
from gpuenv.project.spec import WORKSPACE, Spec
from gpuenv.reservations.gpus import Grant

MEMLOCK_UNLIMITED = -1
STACK_BYTES = 67108864  # what NVIDIA recommends for NGC containers
DEFAULT_SHM = 8 * 1024**3
# Patterns as text: re compiles (and keeps) each on its first use, not at import.
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


def command_for(arguments: Sequence[str]) -> list[str]:
    """``train.py --lr 3e-4`` -> ``python3 train.py --lr 3e-4``; anything else as given."""
    if not arguments:
        raise UsageError(
            "nothing to run", hint="gpuenv run train.py [ARGS], or gpuenv run -- CMD [ARGS]"
        )
    if arguments[0].endswith(".py"):
        return ["python3", *arguments]
    return list(arguments)


def read_env_file(path: str) -> list[tuple[str, str | None]]:
    """KEY=VALUE lines (and bare KEY: take the host's value), # comments, as docker does."""
    out: list[tuple[str, str | None]] = []
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--env-file {path}: cannot read it ({exc})") from None
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, has_value, value = stripped.partition("=")
        if not re.match(_ENV_NAME, key):
            raise UsageError(f"--env-file {path}:{number}: '{key}' is not a variable name")
        out.append((key, value if has_value else None))
    return out


def env_entries(options: Sequence[str], env_files: Sequence[str]) -> list[tuple[str, str | None]]:
    """The env files' lines, then the -e options, in order: (KEY, VALUE), or (KEY, None)
    for a bare KEY, which passes a value from the environment."""
    entries: list[tuple[str, str | None]] = []
    for path in env_files:
        entries += read_env_file(path)
    for option in options:
        key, has_value, value = option.partition("=")
        if not re.match(_ENV_NAME, key):
            raise UsageError(
                f"-e {key!r}: not a variable name (KEY=VALUE, or KEY to pass it through)"
            )
        entries.append((key, value if has_value else None))
    return entries


def environment(
    spec: Spec,
    options: Sequence[str],
    env_files: Sequence[str],
    host_env: Mapping[str, str],
    entries: Sequence[tuple[str, str | None]] | None = None,
) -> dict[str, str]:
    """The spec's env, then env files, then -e options; a bare KEY passes the host's value.
    `entries`: env_entries(options, env_files) when already read."""
    result = dict(spec.env)
    if entries is None:
        entries = env_entries(options, env_files)
    for key, given in entries:
        if given is not None:
            result[key] = given
        elif key in host_env:
            result[key] = host_env[key]
    return result


def labels(
    spec: Spec, lock_digest: str, grant: Grant, identity: Identity | None, command: Sequence[str]
) -> dict[str, str]:
    pid = os.getpid()
    return {
        RUN_LABEL: "1",
        "io.gpuenv.project": spec.name,
        "io.gpuenv.project-dir": os.path.abspath(spec.project_dir),
        "io.gpuenv.lock": lock_digest,
        "io.gpuenv.user": f"{identity.name} ({identity.uid})" if identity else "root (0)",
        "io.gpuenv.gpus": grant.describe(),
        "io.gpuenv.started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "io.gpuenv.command": " ".join(command)[:500],
        "io.gpuenv.host": socket.gethostname(),
        "io.gpuenv.pid": str(pid),
        "io.gpuenv.pid-start": process_start(pid),
    }


def detached_labels(run_labels: Mapping[str, str]) -> dict[str, str]:
    """A detached run: marked so that reaping leaves it, and its GPUs held by it."""
    return {**run_labels, DETACHED_LABEL: "1"}


def memlock_limit() -> int:
    """NGC's `--ulimit memlock=-1`, unless this host caps locked memory (a hard limit the
    engine could not raise either): then that cap, which still lets the container start."""
    _, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return MEMLOCK_UNLIMITED if hard == resource.RLIM_INFINITY else int(hard)


def shm_size(spec: Spec) -> int | None:
    """The spec's shm_size; by default 8 GiB, at most half the host's memory."""
    if spec.ipc == "host":
        return None
    if spec.shm_size:
        return spec.shm_size
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return DEFAULT_SHM
    return min(DEFAULT_SHM, memory // 2)


def container_config(
    spec: Spec,
    image: str,
    command: Sequence[str],
    grant: Grant,
    identity: Identity | None,
    env: Mapping[str, str],
    run_labels: Mapping[str, str],
    *,
    tty: bool,
    stdin: bool,
    binds: Sequence[Bind] = (),
    device_requests: Sequence[Mapping[str, Any]] | None = None,
    workdir: str = "",
) -> dict[str, Any]:
    """The Engine API body for POST /containers/create. `binds`: the extra mounts, as
    gpuenv.project.mounts decided them (the spec's, under the user's rules, and --mount);
    the GPUs as `device_requests` (`run.devices`: legacy or CDI), the legacy request for
    the grant without them. `workdir`: the project's subfolder the user started in,
    where the command starts (a path inside the project, relative)."""
    return {
        "Image": image,
        "Cmd": list(command),
        "WorkingDir": posixpath.join(WORKSPACE, workdir) if workdir else WORKSPACE,
        "User": f"{identity.uid}:{identity.gid}" if identity else "",
        "Env": [f"{key}={value}" for key, value in _container_env(env, grant, identity).items()],
        "Tty": tty,
        "OpenStdin": stdin,
        "StdinOnce": stdin,
        "AttachStdin": stdin,
        "AttachStdout": True,
        "AttachStderr": True,
        "Labels": dict(run_labels),
        "HostConfig": _host_config(spec, grant, binds, device_requests),
    }


def _container_env(
    env: Mapping[str, str], grant: Grant, identity: Identity | None
) -> dict[str, str]:
    """The run's variables, with gpuenv's device order and the granted GPUs over them,
    and the user's HOME and USER unless the run sets them."""
    full_env = {
        **env,
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "NVIDIA_VISIBLE_DEVICES": grant.visible_devices,
    }
    if identity is not None:
        full_env.setdefault("HOME", identity.home)
        full_env.setdefault("USER", identity.name)
    return full_env


def _host_config(
    spec: Spec,
    grant: Grant,
    binds: Sequence[Bind],
    device_requests: Sequence[Mapping[str, Any]] | None,
) -> dict[str, Any]:
    """Mounts (the project at /workspace first), NGC's limits, IPC and shared memory,
    and the GPU requests."""
    mounts: list[dict[str, Any]] = [
        {"Type": "bind", "Source": os.path.abspath(spec.project_dir), "Target": WORKSPACE}
    ]
    mounts += [bind.to_engine() for bind in binds]
    host_config: dict[str, Any] = {
        "Mounts": mounts,
        "Init": True,
        "Ulimits": [
            {"Name": "memlock", "Soft": memlock_limit(), "Hard": memlock_limit()},
            {"Name": "stack", "Soft": STACK_BYTES, "Hard": STACK_BYTES},
        ],
        "SecurityOpt": ["no-new-privileges"],
    }
    size = shm_size(spec)
    if spec.ipc:
        host_config["IpcMode"] = spec.ipc
    if size is not None:
        host_config["ShmSize"] = size
    if device_requests is None:
        device_requests = requests_for(LEGACY, grant)
    if device_requests:
        host_config["DeviceRequests"] = [dict(request) for request in device_requests]
    return host_config


def without_gpus(config: Mapping[str, Any]) -> dict[str, Any]:
    """The same container with no GPU request (for `gpus: optional` without the runtime)."""
    copy = dict(config)
    copy["HostConfig"] = {k: v for k, v in config["HostConfig"].items() if k != "DeviceRequests"}
    copy["Env"] = [
        e if not e.startswith("NVIDIA_VISIBLE_DEVICES=") else "NVIDIA_VISIBLE_DEVICES=void"
        for e in config["Env"]
    ]
    copy["Labels"] = {**config["Labels"], "io.gpuenv.gpus": "none"}
    return copy
