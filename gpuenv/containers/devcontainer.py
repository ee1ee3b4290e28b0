"""What an editor's container is: `.devcontainer/devcontainer.json` for the Dev Containers
tools (VS Code, `@devcontainers/cli`), decided as data from the same facts a run's
container is made of (`run.container`), and read back.

The file is this user's on this host: it names the GPUs gpuenv chose here (by UUID, the
exact grant, never "all" unless the spec asks for every GPU), the user's uid and the
image gpuenv built for them. Before the tools create or start the container, they run
its `initializeCommand`: gpuenv, which claims exactly those GPUs like a run's (refusing
when someone holds them) and leaves a keeper that holds the claims while the container
runs (`app.devcontainer`). What gpuenv needs of the file later (the lock it was written
from, the GPUs, the container's name) is kept under `customizations.gpuenv`.

Facts encoded here, with their sources (containers.dev/implementors/json_reference, and
@devcontainers/cli 0.89, verified against it on a real engine):
- `runArgs` go to `docker run` as they are; `--gpus` takes Docker's CSV form, so two
  device ids are written `"device=A,B"` with the quotes (docker/cli opts/gpus.go).
- `initializeCommand` as an array runs without a shell, on the host, in the workspace
  folder, before the container is created or started, also when one exists (with
  --remove-existing-container, before the old one is removed).
- `${localWorkspaceFolder}` is substituted everywhere in the file.
- With `updateRemoteUserUID: false` and no features, the tools use the image as it is
  (no image of their own is built) and run as `containerUser`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuenv.common import nesting
from gpuenv.common.files import file_hash
from gpuenv.common.labels import DETACHED_LABEL, RUN_LABEL
from gpuenv.errors import FileAccessError, UsageError
from gpuenv.images.accounts import Identity
from gpuenv.lock.lockfile import LOCK_FILENAME
from gpuenv.project.mounts import Bind
from gpuenv.project.ports import Port
from gpuenv.project.spec import WORKSPACE, Spec

DEVCONTAINER_PATH = os.path.join(".devcontainer", "devcontainer.json")
EDITOR_COMMAND = "devcontainer"  # what `gpuenv ps` shows as the run's command
WORKSPACE_FOLDER = "${localWorkspaceFolder}"


class NotOurs(ValueError):
    """The file is not one gpuenv wrote (or was edited past reading)."""


@dataclass(frozen=True)
class EditorContainer:
    """Everything the file says, decided elsewhere: the project, the image, who, which
    GPUs and how the engine takes them, the mounts, the limits, the ports."""

    spec: Spec
    image: str
    lock_hash: str
    name: str  # the container's name (`gpuenv ps` shows it)
    host: str
    identity: Identity | None
    gpus: tuple[str, ...]  # the GPU keys claimed for it (UUIDs; none: nothing to claim)
    gpu_args: tuple[str, ...]  # how `docker run` is told them (`gpu_run_args`)
    visible_devices: str  # NVIDIA_VISIBLE_DEVICES for the grant
    grant: str  # the grant as `gpuenv ps` shows it
    binds: tuple[Bind, ...] = ()
    ports: tuple[Port, ...] = ()
    shm_size: int | None = None
    memlock: int = -1
    stack: int = 67108864
    claim_command: tuple[str, ...] = ()  # argv of the initializeCommand


def container_name(project: str, project_dir: str, uid: int) -> str:
    """The editor container's name: the project's, the user's and the folder's (two
    clones on one host do not share one), the same every time it is written.

    >>> container_name("demo", "/home/alice/demo", 1000)
    'demo-dev-1000-0d8902'
    """
    digest = hashlib.sha256(os.path.abspath(project_dir).encode()).hexdigest()[:6]
    return f"{project}-dev-{uid}-{digest}"


def gpu_run_args(requests: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """The `docker run` options for the Engine API's DeviceRequests (`run.devices`).

    >>> gpu_run_args([{"DeviceIDs": ["GPU-a", "GPU-b"], "Capabilities": [["gpu"]]}])
    ('--gpus', '"device=GPU-a,GPU-b"')
    >>> gpu_run_args([{"Driver": "cdi", "DeviceIDs": ["nvidia.com/gpu=0"]}])
    ('--device', 'nvidia.com/gpu=0')
    >>> gpu_run_args([{"Count": -1, "Capabilities": [["gpu"]]}])
    ('--gpus', 'all')
    >>> gpu_run_args([{"Count": 0, "Capabilities": [["gpu"]]}])  # none: never "all"
    ()
    """
    args: list[str] = []
    for request in requests:
        ids = [str(i) for i in request.get("DeviceIDs") or ()]
        if request.get("Driver") == "cdi":
            for device in ids:
                args += ["--device", device]
        elif ids:
            args += ["--gpus", f'"device={",".join(ids)}"']
        elif (count := int(request.get("Count", -1))) != 0:
            args += ["--gpus", "all" if count < 0 else str(count)]
    return tuple(args)


def _mount(bind: Bind) -> str:
    """A spec mount as the Dev Containers `mounts` take it (Docker's --mount form)."""
    text = f"source={bind.source},target={bind.target},type=bind"
    return text + (",readonly" if bind.read_only else "")


def labels(editor: EditorContainer) -> dict[str, str]:
    """What `gpuenv ps`, `top` and the dashboard read of a run, for the editor's
    container: a detached run (reaping leaves it) whose command is the editor."""
    identity = editor.identity
    return {
        RUN_LABEL: "1",
        DETACHED_LABEL: "1",
        "io.gpuenv.project": editor.spec.name,
        "io.gpuenv.project-dir": os.path.abspath(editor.spec.project_dir),
        "io.gpuenv.lock": editor.lock_hash,
        "io.gpuenv.user": f"{identity.name} ({identity.uid})" if identity else "root (0)",
        "io.gpuenv.gpus": editor.grant,
        "io.gpuenv.command": EDITOR_COMMAND,
        "io.gpuenv.host": editor.host,
    }


def run_args(editor: EditorContainer) -> list[str]:
    """`docker run`'s options: the name, the GPUs, NGC's limits as `gpuenv run` sets
    them, no new privileges, the labels."""
    args = ["--name", editor.name, *editor.gpu_args]
    if editor.shm_size is not None:
        args += ["--shm-size", str(editor.shm_size)]
    if editor.spec.ipc:
        args += ["--ipc", editor.spec.ipc]
    args += [
        "--ulimit",
        f"memlock={editor.memlock}:{editor.memlock}",
        "--ulimit",
        f"stack={editor.stack}:{editor.stack}",
        "--security-opt",
        "no-new-privileges",
    ]
    for key, value in labels(editor).items():
        args += ["--label", f"{key}={value}"]
    return args


def container_env(editor: EditorContainer) -> dict[str, str]:
    """The spec's variables (the image's `$VAR`s in them filled in), then gpuenv's
    device order and the granted GPUs, and the user's HOME and USER unless the spec
    sets them (as a run's)."""
    env = {
        **dict(editor.spec.env),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "NVIDIA_VISIBLE_DEVICES": editor.visible_devices,
    }
    if editor.identity is not None:
        env.setdefault("HOME", editor.identity.home)
        env.setdefault("USER", editor.identity.name)
    return env


def devcontainer_config(editor: EditorContainer) -> dict[str, Any]:
    """The devcontainer.json's content."""
    config: dict[str, Any] = {
        "name": f"{editor.spec.name} (gpuenv)",
        "image": editor.image,
        "workspaceMount": f"source={WORKSPACE_FOLDER},target={WORKSPACE},type=bind",
        "workspaceFolder": WORKSPACE,
    }
    if editor.identity is not None:
        config["containerUser"] = f"{editor.identity.uid}:{editor.identity.gid}"
    config["updateRemoteUserUID"] = False
    config["init"] = True
    config["containerEnv"] = container_env(editor)
    if editor.binds:
        config["mounts"] = [_mount(bind) for bind in editor.binds]
    config["runArgs"] = run_args(editor)
    if editor.ports:
        config["forwardPorts"] = forward_ports(editor.ports)
    if editor.claim_command:
        config["initializeCommand"] = list(editor.claim_command)
    config["shutdownAction"] = "stopContainer"
    config["customizations"] = {
        "gpuenv": {
            "lock": editor.lock_hash,
            "container": editor.name,
            "gpus": list(editor.gpus),
            "uid": editor.identity.uid if editor.identity else 0,
            "host": editor.host,
        }
    }
    return config


def render(config: Mapping[str, Any], who: str) -> str:
    """The file: a comment saying who wrote it and for whom, then the JSON."""
    header = (
        "// Written by `gpuenv export devcontainer` from gpuenv.lock: do not edit, run it\n"
        f"// again instead (after `gpuenv lock`, and on another server). It is {who}'s on\n"
        "// this host: it names this host's GPUs and your uid. Opening it runs gpuenv,\n"
        "// which claims those GPUs while the container runs (`gpuenv ps` shows it).\n"
    )
    return header + json.dumps(config, indent=2) + "\n"


@dataclass(frozen=True)
class Written:
    """What gpuenv wrote into a devcontainer.json, read back (`customizations.gpuenv`)."""

    lock: str
    container: str
    gpus: tuple[str, ...]
    uid: int
    host: str


def read_written(text: str) -> Written:
    """The `customizations.gpuenv` of a devcontainer.json (JSON with comments and
    trailing commas, as the tools read it); NotOurs when it has none.

    >>> read_written('// x\\n{"customizations": {"gpuenv": {"lock": "ab", "container": '
    ...     '"p-dev", "gpus": ["GPU-1"], "uid": 1000, "host": "h",},},}').gpus
    ('GPU-1',)
    """
    try:
        data = nesting.loads(json.loads, strip_jsonc(text))
    except ValueError as exc:  # TooDeep too
        raise NotOurs(f"not JSON ({exc})") from None
    customizations = data.get("customizations") if isinstance(data, dict) else None
    block = customizations.get("gpuenv") if isinstance(customizations, dict) else None
    if not isinstance(block, dict):
        raise NotOurs("no customizations.gpuenv: gpuenv did not write it")
    try:
        gpus = block.get("gpus") or []
        if not isinstance(gpus, list) or not all(isinstance(g, str) for g in gpus):
            raise TypeError("gpus")
        return Written(
            lock=_string(block, "lock"),
            container=_string(block, "container"),
            gpus=tuple(gpus),
            uid=int(block["uid"]),
            host=_string(block, "host"),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise NotOurs(f"customizations.gpuenv is not as gpuenv wrote it ({exc})") from None


def _string(block: Mapping[str, Any], key: str) -> str:
    value = block[key]
    if not isinstance(value, str):
        raise TypeError(key)
    return value


def strip_jsonc(text: str) -> str:
    """JSON with comments (// and /* */) and trailing commas made plain JSON; strings,
    where // may appear, are kept as they are.

    >>> strip_jsonc('{"a": "x//y", // c\\n "b": [1, 2,], /* d */}')
    '{"a": "x//y", \\n "b": [1, 2] }'
    """
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        char = text[i]
        if char == '"':
            end = _string_end(text, i)
            out.append(text[i:end])
            i = end
        elif text.startswith("//", i):
            newline = text.find("\n", i)
            i = n if newline < 0 else newline
        elif text.startswith("/*", i):
            close = text.find("*/", i + 2)
            i = n if close < 0 else close + 2
        elif char == "," and _closes_next(text, i + 1):
            i += 1
        else:
            out.append(char)
            i += 1
    return "".join(out)


def _string_end(text: str, start: int) -> int:
    """Where the JSON string starting at `start` ends (past its closing quote)."""
    i = start + 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
        elif text[i] == '"':
            return i + 1
        else:
            i += 1
    return len(text)


def _closes_next(text: str, start: int) -> bool:
    """Whether the next thing after `start`, past blanks and comments, closes an object
    or an array (a trailing comma)."""
    i = start
    while i < len(text):
        if text[i].isspace():
            i += 1
        elif text.startswith("//", i):
            newline = text.find("\n", i)
            i = len(text) if newline < 0 else newline
        elif text.startswith("/*", i):
            close = text.find("*/", i + 2)
            i = len(text) if close < 0 else close + 2
        else:
            return text[i] in "}]"
    return False


def forward_ports(ports: Iterable[Port]) -> list[int]:
    """The container ports an editor forwards (tcp ones)."""
    return sorted({p.container for p in ports if p.protocol == "tcp"})


def read_devcontainer(path: str) -> Written:
    """What gpuenv wrote into the devcontainer.json at `path`."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        raise UsageError(
            f"no {DEVCONTAINER_PATH} here", hint="`gpuenv export devcontainer` writes it"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise FileAccessError(f"{path}: cannot read it ({exc})") from None
    try:
        return read_written(text)
    except NotOurs as exc:
        raise UsageError(f"{path}: {exc}", hint="`gpuenv export devcontainer` writes it") from None


def stale_against_lock(written: Written, directory: str) -> str | None:
    """Why the file no longer matches gpuenv.lock (None: it does)."""
    lock = os.path.join(directory, LOCK_FILENAME)
    try:
        current = file_hash(lock)
    except OSError:
        return f"it was written from a {LOCK_FILENAME}, and there is none now"
    if current != written.lock:
        return f"it was written from another {LOCK_FILENAME} (the lock changed since)"
    return None


def stale_devcontainer(directory: str) -> str | None:
    """For `check` and `lock --check`: why the project's devcontainer.json written by
    gpuenv is stale against the lock (None: there is none, or it is current)."""
    path = os.path.join(directory, DEVCONTAINER_PATH)
    if not os.path.exists(path):
        return None
    try:
        written = read_devcontainer(path)
    except UsageError:
        return None  # the user's own file: not gpuenv's to judge
    stale = stale_against_lock(written, directory)
    return f"{DEVCONTAINER_PATH}: {stale}" if stale else None
