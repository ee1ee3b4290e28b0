"""What `gpuenv exporter` serves, as data: metric families of per-GPU samples from a
Host, its health findings and who holds each GPU. Pure (no prometheus_client here:
gpuenv.cli.exporter turns these into its metric families).

Label cardinality stays bounded: a GPU's index and UUID (and its MIG instances', at most
seven a GPU, with their profiles), and where a gpuenv run holds it, the run's project,
user and name; never a command line or a process ID.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpuenv.host.machine import Gpu, Host
from gpuenv.monitoring.health import assess
from gpuenv.monitoring.monitor import RunInfo
from gpuenv.reservations.claims import Claim

GPU_LABELS = ("gpu", "uuid", "project", "user", "run")
PREFIX = "gpuenv_gpu_"
MIB = 2**20
MHZ = 1_000_000
# The alert rules on these metrics, shipped in the package (`exporter --print-alert-rules`).
ALERT_RULES = Path(__file__).with_name("alert_rules.yml")

# NVML's clock event reasons by name (nvml.h nvmlClocksEventReason*), each a 0/1 series.
CLOCK_EVENT_REASONS = (
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
)


@dataclass(frozen=True)
class Holder:
    project: str
    user: str
    run: str = ""


@dataclass
class Family:
    name: str
    help: str
    kind: str  # gauge | counter
    labels: tuple[str, ...]
    samples: list[tuple[tuple[str, ...], float]] = field(default_factory=list)


def holders(claims: Sequence[Claim], runs: Sequence[RunInfo]) -> dict[str, Holder]:
    """Who holds each GPU (by key): the run on it, else the live claim on it."""
    held: dict[str, Holder] = {}
    for claim in claims:
        held[claim.gpu] = Holder(claim.project, claim.user)
    for run in runs:
        if run.state != "running":
            continue
        user = run.user.rsplit(" (", 1)[0]  # "alice (1000)": the name is enough
        for key in run.gpus.split(","):
            if key.strip() and key.strip() != "all":
                held[key.strip()] = Holder(run.project, user, run.name)
    return held


@dataclass(frozen=True)
class Reading:
    """A per-GPU gauge: the Gpu field it reads, in the metric's base unit (the field's
    value * scale / per); a GPU that does not report the field (None) gives no sample."""

    name: str
    help: str
    value_of: Callable[[Gpu], float | None]
    scale: int = 1
    per: int = 1

    def read(self, gpu: Gpu) -> float | None:
        value = self.value_of(gpu)
        return None if value is None else value * self.scale / self.per


READINGS = (
    Reading(
        "utilization_ratio",
        "Fraction of the last sample period a kernel ran (NVML utilization.gpu / 100).",
        lambda g: g.utilization,
        per=100,
    ),
    Reading("memory_used_bytes", "GPU memory in use.", lambda g: g.memory_used_mib, MIB),
    Reading("memory_total_bytes", "GPU memory in all.", lambda g: g.memory_total_mib, MIB),
    Reading("temperature_celsius", "GPU core temperature.", lambda g: g.temperature_c),
    Reading(
        "slowdown_temperature_celsius",
        "The temperature at which this GPU slows itself down (NVML threshold).",
        lambda g: g.slowdown_temperature_c,
    ),
    Reading("power_watts", "Power draw.", lambda g: g.power_w),
    Reading("power_limit_watts", "Enforced power limit.", lambda g: g.power_limit_w),
    Reading("sm_clock_hertz", "Current SM clock.", lambda g: g.sm_clock_mhz, MHZ),
    Reading("sm_clock_max_hertz", "Maximum SM clock.", lambda g: g.sm_clock_max_mhz, MHZ),
    Reading("memory_clock_hertz", "Current memory clock.", lambda g: g.memory_clock_mhz, MHZ),
    Reading("pcie_link_generation", "Current PCIe link generation.", lambda g: g.pcie_gen),
    Reading(
        "pcie_link_generation_max",
        "Highest PCIe generation card and slot support.",
        lambda g: g.pcie_gen_max,
    ),
    Reading("pcie_link_width", "Current PCIe link width (lanes).", lambda g: g.pcie_width),
    Reading(
        "pcie_link_width_max", "Widest PCIe link card and slot support.", lambda g: g.pcie_width_max
    ),
)


# A GPU with the label values of its per-GPU samples (index, UUID, who holds it).
_LabelledGpus = Sequence[tuple[Gpu, tuple[str, ...]]]


def families(
    host: Host, held: Mapping[str, Holder], xid_counts: Mapping[tuple[int, int], int]
) -> list[Family]:
    """Every family with this scrape's samples; `xid_counts` is (GPU index, XID) -> count."""
    gpus = [(gpu, _labels(gpu, held)) for gpu in host.gpus]
    return [
        _info(host),
        _up(gpus),
        *_readings(gpus),
        _clock_event_reasons(gpus),
        _ecc(gpus),
        _health(gpus),
        _xids(gpus, xid_counts),
        _mig_instances(host, held),
    ]


def _labels(gpu: Gpu, held: Mapping[str, Holder]) -> tuple[str, ...]:
    """The values of GPU_LABELS for this GPU."""
    holder = held.get(gpu.key, Holder("", ""))
    return (str(gpu.index), gpu.uuid or "", holder.project, holder.user, holder.run)


def _info(host: Host) -> Family:
    info = Family(
        PREFIX + "info",
        "A GPU: its model and the driver.",
        "gauge",
        ("gpu", "uuid", "name", "driver"),
    )
    for gpu in host.gpus:
        info.samples.append(((str(gpu.index), gpu.uuid or "", gpu.name, str(host.driver or "")), 1))
    return info


def _up(gpus: _LabelledGpus) -> Family:
    up = Family(
        PREFIX + "up", "1 if NVML can reach the GPU, 0 if it fell off the bus.", "gauge", GPU_LABELS
    )
    for gpu, labels in gpus:
        up.samples.append((labels, 0 if gpu.lost else 1))
    return up


def _readings(gpus: _LabelledGpus) -> list[Family]:
    """One family per READINGS gauge, with a sample for each GPU that reports it."""
    readings = [Family(PREFIX + r.name, r.help, "gauge", GPU_LABELS) for r in READINGS]
    for gpu, labels in gpus:
        for family, reading in zip(readings, READINGS, strict=True):
            value = reading.read(gpu)
            if value is not None:
                family.samples.append((labels, float(value)))
    return readings


def _clock_event_reasons(gpus: _LabelledGpus) -> Family:
    reasons = Family(
        PREFIX + "clocks_event_reason",
        "1 while NVML reports this reason for holding the clocks down.",
        "gauge",
        (*GPU_LABELS, "reason"),
    )
    for gpu, labels in gpus:
        if gpu.clocks_event_reasons is None:
            continue
        for name, bit in CLOCK_EVENT_REASONS:
            reasons.samples.append(((*labels, name), 1 if gpu.clocks_event_reasons & bit else 0))
    return reasons


def _ecc(gpus: _LabelledGpus) -> Family:
    ecc = Family(
        PREFIX + "ecc_errors",  # a counter: exposed as ..._total (OpenMetrics)
        "ECC errors since the driver loaded (NVML volatile counts).",
        "counter",
        (*GPU_LABELS, "type"),
    )
    for gpu, labels in gpus:
        for kind, count in (("corrected", gpu.ecc_corrected), ("uncorrected", gpu.ecc_uncorrected)):
            if count is not None:
                ecc.samples.append(((*labels, kind), count))
    return ecc


def _health(gpus: _LabelledGpus) -> Family:
    health = Family(
        PREFIX + "health_problem",
        "1 for each health problem gpuenv finds (see `gpuenv top`), by kind and severity.",
        "gauge",
        (*GPU_LABELS, "kind", "severity"),
    )
    for gpu, labels in gpus:
        # One sample per kind and severity: two XIDs are one problem of kind xid here
        # (a series listed twice is invalid exposition); xid_errors counts them.
        found = dict.fromkeys((finding.kind, finding.severity) for finding in assess(gpu))
        for kind, severity in found:
            health.samples.append(((*labels, kind, severity), 1))
    return health


def _xids(gpus: _LabelledGpus, xid_counts: Mapping[tuple[int, int], int]) -> Family:
    xids = Family(
        PREFIX + "xid_errors",
        "XID errors NVML reported since the exporter started (a host file's, as listed).",
        "counter",
        (*GPU_LABELS, "xid"),
    )
    for gpu, labels in gpus:
        for (index, xid), count in sorted(xid_counts.items()):
            if index == gpu.index:
                xids.samples.append(((*labels, str(xid)), count))
    return xids


def _mig_instances(host: Host, held: Mapping[str, Holder]) -> Family:
    mig = Family(
        PREFIX + "mig_instance",
        "1 per MIG instance of a GPU: its UUID, profile (empty: unknown) and who holds it.",
        "gauge",
        ("gpu", "mig_uuid", "profile", "project", "user", "run"),
    )
    for gpu in host.gpus:
        for instance in gpu.mig_devices:
            by = held.get(instance.uuid, Holder("", ""))
            where = (str(gpu.index), instance.uuid, instance.profile or "")
            mig.samples.append(((*where, by.project, by.user, by.run), 1))
    return mig


def idle_families(
    host: Host,
    held: Mapping[str, Holder],
    idle_seconds: Mapping[str, float],
    warn_after: float | None,
) -> list[Family]:
    """How long each held GPU has been idle (GPU key -> seconds, from `gpuenv idle`'s
    samples) and the idle policy's warning time (None: no policy), so that an alert can
    say when a claim sits idle past the policy."""
    idle = Family(
        PREFIX + "claim_idle_seconds",
        "Seconds a held GPU has been below the idle threshold (as `gpuenv idle` sampled it).",
        "gauge",
        GPU_LABELS,
    )
    for gpu in host.gpus:
        if gpu.key in held and gpu.key in idle_seconds:
            idle.samples.append((_labels(gpu, held), idle_seconds[gpu.key]))
    policy = Family(
        "gpuenv_idle_policy_warn_after_seconds",
        "The idle policy's [idle] warn_after: idle this long, a run is warned.",
        "gauge",
        (),
    )
    if warn_after is not None:
        policy.samples.append(((), warn_after))
    return [idle, policy]
