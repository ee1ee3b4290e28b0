"""`gpuenv doctor`: is this machine ready to run gpuenv's containers on its GPUs?

Each check says ok, warn or fail, and for anything but ok what to do.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from gpuenv.common import nesting
from gpuenv.containers.devices import (
    GPU_PATH_ENV,
    EngineFacts,
    GpuPath,
    cdi_dirs,
    choose_path,
    read_cdi_specs,
)
from gpuenv.containers.preflight import preflight
from gpuenv.containers.sizing import (
    SizingSettings,
    disk_finding,
    memory_finding,
    storage_finding,
    storage_kind,
    system_memory_mib,
)
from gpuenv.engine.protocol import Engine
from gpuenv.errors import EngineRefused, GpuenvError, UsageError
from gpuenv.host.detect import detect_host
from gpuenv.host.machine import Host
from gpuenv.images.registry import InvalidMirror, local_references, registry_mirror
from gpuenv.lock.project import load_project
from gpuenv.matrix.load import load_matrix
from gpuenv.monitoring.health import assess_all
from gpuenv.monitoring.history import recorded_findings
from gpuenv.reservations.claims import ClaimStore
from gpuenv.reservations.gpus import Grant
from gpuenv.reservations.statedir import CREATE_HINT, HOSTS_MARKER

MIN_API = (1, 40)  # DeviceRequests
GENERATE_REMEDY = (
    "generate a CDI spec: `sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`"
)


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | fail
    detail: str
    remedy: str = ""

    def to_data(self) -> dict[str, str]:
        return asdict(self)


def _engine(connect: Callable[[], Engine], directory: str, checks: list[Check]) -> object:
    """The engine, its API, its GPU path and rootless mode; the host for later checks."""
    settings = _sizing_settings(checks)
    try:
        api = connect()
        version = api.version()
        info = api.info()
    except GpuenvError as exc:
        checks.append(Check("Docker engine", "fail", exc.message, exc.hint or ""))
        return _driver(checks, settings)
    facts = EngineFacts.from_engine(version, info)
    api_version = str(version.get("ApiVersion", "0.0"))
    numbers = tuple(int(p) for p in api_version.split(".")[:2])
    if facts.product == "podman":
        mode = "rootless" if facts.rootless else "rootful"
        checks.append(Check("Podman", "ok", f"{api.endpoint}: Podman {facts.version} ({mode})"))
    else:
        detail = f"{api.endpoint}: Engine {version.get('Version')}"
        checks.append(Check("Docker engine", "ok", detail + (" (rootless)" * facts.rootless)))
        if numbers < MIN_API:
            checks.append(
                Check(
                    "Engine API version",
                    "fail",
                    f"API {api_version} is older than 1.40",
                    "upgrade Docker to 19.03 or newer (GPU requests need API 1.40)",
                )
            )
        else:
            checks.append(Check("Engine API version", "ok", f"API {api_version}"))
    host = _driver(checks, settings)
    path = _gpu_path(facts, host, checks)
    _rootless(facts, checks)
    if facts.product == "docker" and (path is None or path.method == "legacy"):
        _gpu_runtime(api, info, checks)
    _disk(api, info, directory, settings, checks)
    return host


def _gpu_path(facts: EngineFacts, host: object, checks: list[Check]) -> GpuPath | None:
    """Which way GPUs reach containers here (legacy or CDI), and what is wrong with it."""
    known = host if isinstance(host, Host) else Host(None)
    forced = os.environ.get(GPU_PATH_ENV, "").strip().lower() or None
    dirs = cdi_dirs(os.environ, facts.cdi_dirs)
    path = choose_path(facts, read_cdi_specs(dirs), known, forced)
    detail = path.describe()
    if path.method == "cdi":
        missing = [g.key for g in known.gpus if g.key not in path.names]
        missing += [m.uuid for g in known.gpus for m in g.mig_devices if m.uuid not in path.names]
        if not path.names and not path.all_device:
            checks.append(
                Check("GPU path", "fail", detail, "; ".join(path.problems) or GENERATE_REMEDY)
            )
        elif missing:
            checks.append(
                Check(
                    "GPU path",
                    "warn",
                    f"{detail}; no CDI device for {', '.join(missing)}",
                    "; ".join(path.problems) or GENERATE_REMEDY,
                )
            )
        else:
            checks.append(
                Check(
                    "GPU path", "warn" if path.problems else "ok", detail, "; ".join(path.problems)
                )
            )
    else:
        where = f" (CDI specs read from {', '.join(dirs)})" if facts.cdi_enabled else ""
        checks.append(
            Check(
                "GPU path",
                "warn" if path.problems else "ok",
                detail + where,
                "; ".join(path.problems),
            )
        )
    return path


def _rootless(facts: EngineFacts, checks: list[Check]) -> None:
    if not facts.rootless:
        return
    if facts.product == "podman":
        checks.append(
            Check(
                "rootless",
                "ok",
                "rootless Podman: runs use --userns=keep-id, so files written in the project "
                "stay yours; GPUs are the CDI spec's device nodes, without cgroup device "
                "control",
                "",
            )
        )
        return
    checks.append(
        Check(
            "rootless",
            "warn",
            "rootless Docker: containers run in your user namespace, files in the project "
            "stay yours; there is no cgroup device control, so the NVIDIA runtime's --gpus "
            "fails unless its cgroup step is off",
            "set `no-cgroups = true` under [nvidia-container-cli] in "
            "/etc/nvidia-container-runtime/config.toml (`sudo nvidia-ctk config --set "
            "nvidia-container-cli.no-cgroups --in-place`), or use CDI",
        )
    )


# A command no image has: starting it fails after the GPU request was handled.
PROBE = "/gpuenv-doctor-probe-does-not-exist"


def _gpu_runtime(api: Engine, info: dict[str, Any], checks: list[Check]) -> None:
    """Ask the engine itself: start a container with a GPU request and a command that
    cannot exist. 'could not select device driver' means no NVIDIA runtime; failing on
    the command means the request got through. Nothing is executed."""
    tagged = [image for image in api.images() if image.tags]
    if not tagged:
        checks.append(_untested_runtime(info))
        return
    checks.append(_runtime_verdict(_probe_refusal(api, tagged[0].tags[0])))


def _untested_runtime(info: dict[str, Any]) -> Check:
    """Without an image to probe with: whether a runtime is at least registered."""
    if "nvidia" in (info.get("Runtimes") or {}) or info.get("CDISpecDirs"):
        detail = (
            "registered (nvidia runtime or CDI), not tested: the engine has no image to test with"
        )
    else:
        detail = "not checked: the engine has no image to test with"
    return Check("NVIDIA runtime", "warn", detail, "run `gpuenv build`, then `gpuenv doctor` again")


def _probe_refusal(api: Engine, image: str) -> str:
    """Why the engine refused to start `image` with a GPU request and the probe as its
    command ("" if it started); the container is removed either way."""
    config = {
        "Image": image,
        "Entrypoint": [PROBE],
        "Cmd": [],
        "Labels": {"io.gpuenv.doctor": "1"},
        "HostConfig": {"DeviceRequests": [{"Count": -1, "Capabilities": [["gpu"]]}]},
    }
    container = api.create(config)
    try:
        api.start(container)
        return ""
    except EngineRefused as exc:
        return exc.message
    finally:
        api.remove(container)


def _runtime_verdict(message: str) -> Check:
    """What the engine's refusal of the probe says about its NVIDIA runtime."""
    if "could not select device driver" in message:
        return Check(
            "NVIDIA runtime",
            "fail",
            "the engine cannot give containers GPUs (could not select device driver)",
            "install the NVIDIA Container Toolkit and restart Docker: "
            "https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/",
        )
    if PROBE in message:  # the GPU request was taken; only the probe could not run
        return Check("NVIDIA runtime", "ok", "GPU requests reach the engine's NVIDIA driver")
    # Refused for another reason (the toolkit, the driver, CDI): say which.
    return Check(
        "NVIDIA runtime",
        "fail",
        f"a container with a GPU request did not get to start its command: "
        f"{message or 'it started, which a probe that does not exist cannot'}",
        "fix what the engine says (`docker run --rm --gpus all IMAGE true` shows "
        "the same), then `gpuenv doctor` again",
    )


def _sizing_settings(checks: list[Check]) -> SizingSettings:
    try:
        return SizingSettings.load()
    except UsageError as exc:
        checks.append(Check("sizing settings", "fail", exc.message, "the defaults are used"))
        return SizingSettings()


def _disk(
    api: Engine, info: dict[str, Any], directory: str, settings: SizingSettings, checks: list[Check]
) -> None:
    """The engine's data root: the storage it is on, and room for the lock's image."""
    root = str(info.get("DockerRootDir") or info.get("GraphRoot") or "/var/lib/docker")
    missing = 0
    if os.path.exists(os.path.join(directory, "gpuenv.lock")):
        try:
            lock = load_project(directory).lock
            names = local_references(lock.image, lock.digest, _mirror())
            missing = 0 if any(api.has_image(name) for name in names) else 1
        except GpuenvError:
            missing = 0  # the lock check says what is wrong with it
    checks.append(Check("disk", *disk_finding(root, missing, settings)))
    checks.append(Check("storage", *storage_finding(root, storage_kind(root))))


def _mirror() -> str | None:
    """The nvcr.io mirror pulls go through; None where none is set (a bad one: its own
    check says so)."""
    try:
        return registry_mirror()[0]
    except InvalidMirror:
        return None


def _driver(checks: list[Check], settings: SizingSettings) -> object:
    try:
        host = detect_host()
    except GpuenvError as exc:
        checks.append(Check("NVIDIA driver", "fail", exc.message, exc.hint or ""))
        return None
    if host.driver is None:
        checks.append(
            Check(
                "NVIDIA driver",
                "warn",
                f"no NVIDIA driver found ({host.note})",
                "install the NVIDIA driver to run on GPUs; gpuenv still plans and builds here",
            )
        )
    else:
        checks.append(Check("NVIDIA driver", "ok", host.describe()))
        _health(host.gpus, checks)
        _mig(host.gpus, checks)
        memory = memory_finding(system_memory_mib(), host.gpus, settings)
        if memory is not None:
            checks.append(Check("system memory", *memory))
    return host


def _mig(gpus: Any, checks: list[Check]) -> None:
    """One check per GPU in MIG mode: its instances (profile, memory, UUID), as runs
    ask for them (`--gpus MIG-<uuid>`, `gpus: {mig: PROFILE}`)."""
    for gpu in gpus:
        if not gpu.mig_mode:
            continue
        if not gpu.mig_devices:
            checks.append(
                Check(
                    f"GPU {gpu.index} MIG",
                    "warn",
                    "in MIG mode without instances: no run can use it",
                    "create instances (`sudo nvidia-smi mig -i "
                    f"{gpu.index} -cgi 1g.10gb -C`), or turn MIG mode off",
                )
            )
            continue
        listed = []
        for mig in gpu.mig_devices:
            profile = mig.profile or "profile unknown"
            if mig.profile_source == "derived":
                profile += " (derived from slices and memory)"
            memory = f", {mig.memory_total_mib} MiB" if mig.memory_total_mib is not None else ""
            where = f"{gpu.index}:{'?' if mig.index is None else mig.index}"
            listed.append(f"{where} {profile}{memory} {mig.uuid}")
        noun = "instance" if len(listed) == 1 else "instances"
        checks.append(
            Check(f"GPU {gpu.index} MIG", "ok", f"{len(listed)} {noun}: " + "; ".join(listed))
        )


def _health(gpus: Any, checks: list[Check]) -> None:
    """One check per health finding (an info one is ok, with what it saw), the XIDs a
    sampler recorded in the last day among them; ok if none."""
    findings = assess_all(gpus) + recorded_findings(gpus)
    status = {"info": "ok", "warn": "warn", "fail": "fail"}
    for finding in findings:
        checks.append(
            Check(
                f"GPU {finding.gpu} health",
                status[finding.severity],
                finding.message,
                finding.remedy,
            )
        )
    if gpus and not findings:
        noun = "GPU" if len(gpus) == 1 else f"{len(gpus)} GPUs"
        checks.append(
            Check("GPU health", "ok", f"{noun}: no slowdown, link, ECC or bus problem NVML reports")
        )


def _lock(directory: str, host: object, checks: list[Check]) -> None:
    if not os.path.exists(os.path.join(directory, "gpuenv.lock")):
        return
    try:
        project = load_project(directory)
    except GpuenvError as exc:
        checks.append(Check("gpuenv.lock", "fail", exc.message, exc.hint or ""))
        return
    if host is None or getattr(host, "driver", None) is None:
        checks.append(
            Check("gpuenv.lock", "ok", f"{project.lock.image} (no driver here to check against)")
        )
        return

    try:
        preflight(project.lock.locked(""), host, Grant("all"), load_matrix())  # type: ignore[arg-type]
    except GpuenvError as exc:
        checks.append(Check("gpuenv.lock", "fail", exc.message, exc.hint or ""))
        return
    checks.append(Check("gpuenv.lock", "ok", f"{project.lock.image} runs on this host"))


def _credentials(checks: list[Check]) -> None:
    if os.environ.get("NGC_API_KEY"):
        checks.append(Check("nvcr.io credentials", "ok", "NGC_API_KEY is set"))
        return
    path = os.path.join(
        os.environ.get("DOCKER_CONFIG") or os.path.expanduser("~/.docker"), "config.json"
    )
    try:
        with open(path, encoding="utf-8") as handle:
            config = nesting.loads(json.loads, handle.read())
    except (OSError, ValueError):
        config = {}
    if "nvcr.io" in (config.get("auths") or {}) or "nvcr.io" in (config.get("credHelpers") or {}):
        checks.append(Check("nvcr.io credentials", "ok", f"docker login nvcr.io ({path})"))
    else:
        checks.append(
            Check(
                "nvcr.io credentials",
                "warn",
                "none: public NGC images pull anonymously",
                "for private NGC images set NGC_API_KEY, or `docker login nvcr.io`",
            )
        )


def _state(checks: list[Check]) -> None:
    try:
        store = ClaimStore()
        with store.locked():
            count = len(store.claims())
    except GpuenvError as exc:
        checks.append(Check("state folder", "fail", exc.message, exc.hint or CREATE_HINT))
        return
    store.close()
    noun = "claim" if count == 1 else "claims"
    kind = "shared by this host's users" if store.folder.shared else "private to you"
    if store.folder.between_hosts:
        kind += f", and between hosts ({HOSTS_MARKER})"
    checks.append(
        Check("state folder", "ok", f"{store.directory} ({kind}): {count} live GPU {noun}")
    )
    if store.folder.note:
        checks.append(Check("shared state folder", "warn", store.folder.note, CREATE_HINT))
    elif not store.folder.shared:
        checks.append(
            Check(
                "shared state folder",
                "warn",
                "none: GPU claims protect your own runs only",
                f"on a server several people use, {CREATE_HINT}",
            )
        )
    if store.job_map is not None:
        where = store.job_map.path
        checks.append(Check("dcgm-exporter job mapping", "ok", f"{where}: kept by gpuenv"))
    for problem in store.job_map_problems:
        checks.append(
            Check(
                "dcgm-exporter job mapping",
                "warn",
                problem,
                "docs/reference/monitoring.md, 'dcgm-exporter job labels', says how to set it up",
            )
        )
    for problem in store.problems:
        checks.append(
            Check(
                "state file",
                "warn",
                problem,
                "not made by gpuenv, or made to mislead it: its owner or root can remove it",
            )
        )


def run_checks(directory: str, connect: Callable[[], Engine]) -> list[Check]:
    """Every check, in order; `connect` makes the engine (its failure is a check)."""
    checks: list[Check] = []
    steps: list[Callable[[], object]] = [
        lambda: _lock(directory, _engine(connect, directory, checks), checks),
        lambda: _credentials(checks),
        lambda: _state(checks),
    ]
    for step in steps:
        step()
    return checks
