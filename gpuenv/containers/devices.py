"""How GPUs reach a container on this host: the legacy NVIDIA device request, or CDI.

Pure decisions over facts gathered elsewhere: what the engine says of itself
(`EngineFacts`), the CDI spec files on the host (`read_cdi_specs`) and the GPUs NVML (or
the host file) lists. `choose_path` picks the way that works and names what is wrong;
`device_requests` turns a grant into the Engine API's `DeviceRequests` for that way. The
lock and the exports never see any of this: the same project runs either way.

Facts encoded here, with their sources:
- Docker takes CDI devices as ``DeviceRequest{Driver: "cdi", DeviceIDs: [...]}`` with no
  Count, Options or Capabilities (moby daemon/cdi.go ``injectCDIDevices``) from Engine 25
  (API 1.44, whose ``GET /info`` reports ``CDISpecDirs``; an empty list means CDI is off,
  moby api/docs/CHANGELOG.md v1.44); Engine 28.2 turns CDI on by default (moby
  daemon/command/daemon.go ``cdiEnabled``), with ``cdi-spec-dirs`` in daemon.json.
- The newest ``cdiVersion`` an engine reads is the one of the CDI library it vendors
  (tags.cncf.io/container-device-interface specs-go ``validSpecVersions``): moby v25.0
  and v26.0 vendor specs-go v0.6.0, v26.1-v27.4 v0.7.0, v27.5 and v28.0 v0.8.0, v28.1 and
  later v1.0.0 (moby vendor.mod at those tags); Podman 4.3 reads up to 0.5.0 (Debian 12's
  podman 4.3.1 refuses a 0.6.0 spec), newer spec versions break older runtimes
  (NVIDIA/nvidia-container-toolkit#1860).
- Podman's Docker-compatible API ignores ``DeviceRequests`` before 5.4 (containers/podman
  #22645, fixed by #25171): the Podman adapter sends CDI devices through its libpod API.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from gpuenv.common import nesting
from gpuenv.engine.protocol import ContainerEngine
from gpuenv.errors import UsageError
from gpuenv.host.machine import Host
from gpuenv.host.mig import cdi_mig_names
from gpuenv.reservations.gpus import Grant

CDI_KIND = "nvidia.com/gpu"
DEFAULT_CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
CDI_DIRS_ENV = "GPUENV_CDI_SPEC_DIRS"  # colon-separated, where this client reads the specs
GPU_PATH_ENV = "GPUENV_GPU_PATH"  # legacy | cdi: override the detection
GENERATE_HINT = "generate one: `sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`"
CDI_MIN_API = (1, 44)

# (engine, first version, newest cdiVersion it reads), newest first per engine.
CDI_READS: tuple[tuple[str, str, str], ...] = (
    ("docker", "28.1", "1.0.0"),
    ("docker", "27.5", "0.8.0"),
    ("docker", "26.1", "0.7.0"),
    ("docker", "25.0", "0.6.0"),
    ("podman", "5.0", "0.6.0"),
    ("podman", "4.1", "0.5.0"),
)
# Patterns as text: re compiles (and keeps) each on its first use, not at import.
_SO_VERSION = r"\.so\.(\d+\.\d+(?:\.\d+)?)$"
_LEADING = r"^v?(\d+(?:\.\d+)*)"


def numeric(text: str) -> tuple[int, ...] | None:
    """The leading numbers of a version ("20.10.24+dfsg1" -> (20, 10, 24)); None if none.

    >>> numeric("4.3.1"), numeric("v0.5.0"), numeric("dev")
    ((4, 3, 1), (0, 5, 0), None)
    """
    match = re.match(_LEADING, text.strip())
    return tuple(int(p) for p in match.group(1).split(".")) if match else None


@dataclass(frozen=True)
class CdiSpec:
    """One CDI spec file as far as gpuenv reads it (cdiVersion, kind, devices[].name,
    the host paths its containerEdits need), or why it could not be read."""

    path: str
    version: str = ""
    kind: str = ""
    devices: tuple[str, ...] = ()
    host_paths: tuple[str, ...] = ()
    renamed_nodes: tuple[tuple[str, str], ...] = ()  # (path, hostPath) where they differ
    error: str | None = None

    def qualified(self, name: str) -> str:
        return f"{self.kind}={name}"


def _renamed(edits: Mapping[str, Any]) -> list[tuple[str, str]]:
    return [
        (str(node["path"]), str(node["hostPath"]))
        for node in edits.get("deviceNodes") or ()
        if isinstance(node, Mapping)
        and node.get("hostPath")
        and node.get("path")
        and node["hostPath"] != node["path"]
    ]


def _edit_paths(edits: Mapping[str, Any]) -> list[str]:
    paths = []
    for node in edits.get("deviceNodes") or ():
        if isinstance(node, Mapping):
            paths.append(str(node.get("hostPath") or node.get("path") or ""))
    for mount in edits.get("mounts") or ():
        if isinstance(mount, Mapping):
            paths.append(str(mount.get("hostPath") or ""))
    return [p for p in paths if p]


def parse_cdi_spec(path: str, text: str) -> CdiSpec:
    """A spec from its JSON or YAML text (the CDI SPEC.md format)."""
    try:
        data = nesting.loads(json.loads if path.endswith(".json") else yaml.safe_load, text)
    except ValueError as exc:
        return CdiSpec(path, error=f"not valid JSON: {str(exc).splitlines()[0]}")
    except (yaml.YAMLError, nesting.TooDeep) as exc:
        return CdiSpec(path, error=f"not valid YAML: {str(exc).splitlines()[0]}")
    if not isinstance(data, Mapping) or not data.get("cdiVersion") or not data.get("kind"):
        return CdiSpec(path, error="not a CDI spec (no cdiVersion or kind)")
    edits = [data.get("containerEdits") or {}]
    names = []
    for device in data.get("devices") or ():
        if isinstance(device, Mapping) and device.get("name"):
            names.append(str(device["name"]))
            edits.append(device.get("containerEdits") or {})
    paths = [p for e in edits if isinstance(e, Mapping) for p in _edit_paths(e)]
    renamed = [r for e in edits if isinstance(e, Mapping) for r in _renamed(e)]
    return CdiSpec(
        path,
        str(data["cdiVersion"]),
        str(data["kind"]),
        tuple(names),
        tuple(dict.fromkeys(paths)),
        tuple(renamed),
    )


def cdi_dirs(env: Mapping[str, str], engine_dirs: Sequence[str] | None) -> tuple[str, ...]:
    """Where to read specs: GPUENV_CDI_SPEC_DIRS, else the engine's, else the defaults."""
    if env.get(CDI_DIRS_ENV):
        return tuple(d for d in env[CDI_DIRS_ENV].split(":") if d)
    return tuple(engine_dirs) if engine_dirs else DEFAULT_CDI_DIRS


def read_cdi_specs(directories: Iterable[str]) -> list[CdiSpec]:
    """Every *.json/*.yaml/*.yml spec in the directories (missing ones are skipped)."""
    specs = []
    for directory in directories:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            if not name.endswith((".json", ".yaml", ".yml")):
                continue
            path = os.path.join(directory, name)
            try:
                with open(path, encoding="utf-8") as handle:
                    specs.append(parse_cdi_spec(path, handle.read()))
            except (OSError, UnicodeDecodeError) as exc:
                specs.append(CdiSpec(path, error=f"cannot read it ({exc})"))
    return specs


@dataclass(frozen=True)
class EngineFacts:
    """What the engine says of itself (GET /version and /info), as gpu path detection
    needs it."""

    product: str = "docker"  # docker | podman
    version: str = ""
    api_version: str = "0.0"
    cdi_dirs: tuple[str, ...] | None = None  # None: the engine does not say (API < 1.44)
    cdi_devices: tuple[str, ...] = ()  # DiscoveredDevices (Docker >= 28.3, API 1.50)
    rootless: bool = False

    @classmethod
    def from_engine(
        cls, version: Mapping[str, Any], info: Mapping[str, Any], product: str = "docker"
    ) -> EngineFacts:
        components = [str(c.get("Name", "")) for c in version.get("Components") or ()]
        if any("podman" in name.lower() for name in components):
            product = "podman"
        security = [str(s) for s in info.get("SecurityOptions") or ()]
        rootless = any("name=rootless" in s for s in security) or bool(version.get("Rootless"))
        dirs = info.get("CDISpecDirs")
        devices = [
            str(d.get("ID", ""))
            for d in info.get("DiscoveredDevices") or ()
            if isinstance(d, Mapping) and d.get("Source") == "cdi"
        ]
        engine_version = str(version.get("Version", ""))
        if product == "podman":
            engine_version = next(
                (
                    str(c.get("Version", ""))
                    for c in version.get("Components") or ()
                    if "podman" in str(c.get("Name", "")).lower()
                ),
                engine_version,
            )
        return cls(
            product=product,
            version=engine_version,
            api_version=str(version.get("ApiVersion", "0.0")),
            cdi_dirs=tuple(str(d) for d in dirs) if isinstance(dirs, list) else None,
            cdi_devices=tuple(d for d in devices if d),
            rootless=rootless,
        )

    @property
    def api(self) -> tuple[int, ...]:
        return tuple(int(p) for p in self.api_version.split(".")[:2] if p.isdigit())

    @property
    def cdi_enabled(self) -> bool:
        if self.product == "podman":
            return True
        return self.api >= CDI_MIN_API and bool(self.cdi_dirs)

    @property
    def reads_cdi_up_to(self) -> str | None:
        """The newest cdiVersion this engine reads; None when it cannot use CDI at all."""
        mine = numeric(self.version)
        for product, first, newest in CDI_READS:
            if product == self.product and mine is not None and mine >= (numeric(first) or ()):
                return newest
        return None


@dataclass(frozen=True)
class GpuPath:
    """The way a run's GPUs reach the container, and what is wrong with the other."""

    method: str  # legacy | cdi
    reason: str
    names: dict[str, str] = field(default_factory=dict)  # GPU key/index -> CDI device
    all_device: str | None = None
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        return f"{self.method}: {self.reason}"


def _version_above(version: str, newest: str) -> bool:
    mine, limit = numeric(version), numeric(newest)
    return mine is not None and limit is not None and mine > limit


def spec_problems(
    spec: CdiSpec,
    facts: EngineFacts,
    host: Host,
    exists: Callable[[str], bool] = os.path.exists,
) -> tuple[list[str], list[str]]:
    """Why the engine cannot use this spec (unreadable, too new a cdiVersion, stale), and
    what is wrong with it that still leaves it usable (a GPU this host no longer has)."""
    if spec.error:
        return [f"{spec.path}: {spec.error}"], []
    problems = []
    newest = facts.reads_cdi_up_to
    if newest and _version_above(spec.version, newest):
        problems.append(
            f"{spec.path}: cdiVersion {spec.version}, but {facts.product} {facts.version} reads "
            f"CDI specs up to {newest}: regenerate it for this engine "
            "(`nvidia-ctk cdi generate --format=json`) or upgrade the engine"
        )
    missing = [p for p in spec.host_paths if not exists(p)]
    stale = [
        p
        for p in spec.host_paths
        if host.driver
        and (m := re.search(_SO_VERSION, p))
        and m.group(1) != str(host.driver)
        and os.path.basename(p).startswith(("libnvidia", "libcuda"))
    ]
    if stale:
        problems.append(
            f"{spec.path}: stale after a driver upgrade: it mounts {stale[0]}, but the driver "
            f"is {host.driver}; {GENERATE_HINT}"
        )
    elif missing:
        problems.append(
            f"{spec.path}: {len(missing)} host path(s) it needs are missing (e.g. {missing[0]}); "
            f"{GENERATE_HINT}"
        )
    if facts.product == "podman" and facts.rootless:
        # Observed on Podman 4.3.1: rootless, a node is bind-mounted from its `path`, not
        # its `hostPath` (runc cannot mknod in a user namespace).
        unbound = [(p, h) for p, h in spec.renamed_nodes if not exists(p)]
        if unbound:
            problems.append(
                f"{spec.path}: rootless Podman binds device nodes from their own path, but "
                f"{unbound[0][0]} (hostPath {unbound[0][1]}) does not exist on the host: "
                "give the node's host path as its path"
            )
    uuids = host.uuids
    gone = [d for d in spec.devices if d.startswith(("GPU-", "MIG-")) and uuids and d not in uuids]
    warnings = [
        f"{spec.path}: names {d}, which this host does not have; {GENERATE_HINT}" for d in gone
    ]
    return problems, warnings[:1]


def _names(specs: Sequence[CdiSpec], host: Host) -> tuple[dict[str, str], str | None, list[str]]:
    devices: dict[str, str] = {}
    for spec in specs:
        for name in spec.devices:
            devices.setdefault(name, spec.qualified(name))
    names: dict[str, str] = {}
    notes = []
    for gpu in host.gpus:
        if gpu.uuid and gpu.uuid in devices:
            names[gpu.uuid] = devices[gpu.uuid]
        elif str(gpu.index) in devices:
            names[gpu.key] = devices[str(gpu.index)]
            notes.append(
                f"the CDI spec names GPU {gpu.index} by index: gpuenv maps it to NVML's index "
                "(CUDA's and nvidia-ctk's can differ; `--device-name-strategy=uuid` avoids it)"
            )
        names.update(cdi_mig_names(gpu, devices))
    if not host.gpus:  # GPUs not known here: the spec's own names, by index or UUID
        names.update({n: q for n, q in devices.items() if n != "all"})
    return names, devices.get("all"), notes[:1]


def choose_path(
    facts: EngineFacts,
    specs: Sequence[CdiSpec],
    host: Host,
    forced: str | None = None,
    exists: Callable[[str], bool] = os.path.exists,
) -> GpuPath:
    """Legacy or CDI for this engine and host; CDI wherever the engine has it and a
    usable nvidia.com/gpu spec exists (Podman: always CDI)."""
    mine = [s for s in specs if s.kind == CDI_KIND or s.error]
    problems: list[str] = []
    usable = []
    for spec in mine:
        found, warnings = spec_problems(spec, facts, host, exists)
        problems += found + warnings
        if not found:
            usable.append(spec)
    if facts.cdi_devices and not mine:  # a remote Docker: its own listing
        listed = [
            CdiSpec(
                "engine",
                "",
                CDI_KIND,
                tuple(
                    d.split("=", 1)[1] for d in facts.cdi_devices if d.startswith(CDI_KIND + "=")
                ),
            )
        ]
        usable = [s for s in listed if s.devices]
    names, all_device, notes = _names(usable, host)
    wants_cdi = forced == "cdi" or (
        forced != "legacy" and (facts.product == "podman" or (facts.cdi_enabled and usable))
    )
    if not wants_cdi:
        if facts.product == "docker" and facts.cdi_enabled:
            reason = "the NVIDIA device request (no usable nvidia.com/gpu CDI spec)"
        elif facts.product == "docker" and facts.api >= CDI_MIN_API:
            reason = "the NVIDIA device request (CDI is off in this engine)"
        else:
            reason = "the NVIDIA device request"
        if forced == "legacy":
            reason += f" ({GPU_PATH_ENV}=legacy)"
        return GpuPath("legacy", reason, problems=tuple(problems), notes=tuple(notes))
    if facts.product == "docker" and not facts.cdi_enabled:
        problems.insert(
            0,
            f"CDI is not enabled in Docker {facts.version} (API {facts.api_version}): it needs "
            'Engine 25 or newer with CDI on (`"features": {"cdi": true}` in daemon.json '
            "before 28.2)",
        )
    if not usable:
        problems.append(
            f"no usable {CDI_KIND} CDI spec in the engine's spec directories; " + GENERATE_HINT
        )
    count = sum(len(s.devices) for s in usable)
    where = ", ".join(s.path for s in usable) or "none"
    reason = f"CDI, {count} {CDI_KIND} device(s) in {where}"
    return GpuPath("cdi", reason, names, all_device, tuple(problems), tuple(notes))


LEGACY = GpuPath("legacy", "the NVIDIA device request")


class MissingCdiDevice(LookupError):
    """A granted GPU has no CDI device (the caller turns it into a user-facing error)."""


def device_requests(path: GpuPath, grant: Grant) -> list[dict[str, Any]]:
    """The Engine API ``HostConfig.DeviceRequests`` for a grant on this path."""
    if grant.mode == "none":
        return []
    if path.method == "legacy":
        if grant.mode == "all":
            return [{"Count": -1, "Capabilities": [["gpu"]]}]
        return [{"DeviceIDs": list(grant.devices), "Capabilities": [["gpu"]]}]
    if grant.mode == "all":
        ids = [path.all_device] if path.all_device else sorted(set(path.names.values()))
    else:
        ids = []
        for device in grant.devices:
            if device not in path.names:
                raise MissingCdiDevice(device)
            ids.append(path.names[device])
    if not ids:
        raise MissingCdiDevice("all")
    return [{"Driver": "cdi", "DeviceIDs": ids}]


def engine_facts(engine: ContainerEngine) -> EngineFacts:
    """The engine's facts (GET /info only where it says anything about CDI: Docker 25+;
    Podman's adapter puts what a run needs in its version)."""
    version = engine.version()
    facts = EngineFacts.from_engine(version, {})
    if facts.product == "docker" and facts.api >= CDI_MIN_API:
        facts = EngineFacts.from_engine(version, engine.info())
    return facts


def detect_path(
    engine: ContainerEngine,
    host: Host,
    environ: Mapping[str, str],
    facts: EngineFacts | None = None,
) -> GpuPath:
    """The GPU path for runs on this engine and host (GPUENV_GPU_PATH forces one);
    `facts`, the engine's, when they were asked already."""
    if facts is None:
        facts = engine_facts(engine)
    forced = environ.get(GPU_PATH_ENV, "").strip().lower() or None
    if forced not in (None, "legacy", "cdi"):
        raise UsageError(f"{GPU_PATH_ENV}={forced}: not legacy or cdi")
    specs = read_cdi_specs(cdi_dirs(environ, facts.cdi_dirs))
    return choose_path(facts, specs, host, forced)
