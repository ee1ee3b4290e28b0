"""resolve(spec, matrix, host) -> Resolution: the newest image that runs here, and why.

Pure: no I/O. Every image of the spec's framework is checked against three groups of
constraints, and each failed check becomes a sentence a user can act on:

1. the spec: framework version, Python, CUDA;
2. the driver: at least the image's minimum, or, on data-center GPUs only, a driver of
   a branch NVIDIA supports for forward compatibility (`gpuenv.resolution.forward`);
3. the GPUs: compute capability at least the image's minimum, and one the image's CUDA
   toolkit builds for (natively, or through a lower minor of the same major, which
   NVIDIA's binary-compatibility rule allows).

The newest image with no failed check wins. When none is left, the error names the
nearest candidates and the smallest change that would make one fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from packaging.specifiers import SpecifierSet

from gpuenv.common.versions import (
    ComputeCapability,
    DriverVersion,
    as_written,
    matches,
    parse_version,
    release_of,
    selects_builds,
)
from gpuenv.host.machine import Host
from gpuenv.matrix.load import FRAMEWORK_NAMES, ImageRow, Matrix
from gpuenv.matrix.sync import how_to_record
from gpuenv.project.spec import Spec
from gpuenv.resolution.explain import (
    SPEC_FIELDS,
    cannot_drive,
    drive_reason,
    not_for_jetson,
    unresolvable,
    warnings_for,
)
from gpuenv.resolution.forward import forward_verdict
from gpuenv.resolution.pins import Pin, conflicting_pins, pin_reasons, pins_unsatisfiable
from gpuenv.resolution.verdicts import Candidate, HostGpu, Rejection, Resolution


def classify_gpus(host: Host, matrix: Matrix) -> tuple[HostGpu, ...]:
    """Attach compute capability and class; NVML's compute capability wins over the matrix."""
    out = []
    for gpu in host.gpus:
        model = matrix.find_gpu(gpu.name)
        cc = gpu.compute_capability or (model.compute_capability if model else None)
        gpu_class = model.gpu_class if model else _class_from_brand(gpu.brand)
        arch = model.architecture if model else None
        if arch is None and cc:
            known = matrix.architecture(cc)
            arch = known.architecture if known else None
        floor, ceiling = matrix.drive_floor(cc, model), matrix.drive_ceiling(cc)
        out.append(HostGpu(gpu, cc, gpu_class, floor, arch, ceiling))
    return tuple(out)


def platform_fits(platforms: Sequence[str], platform: str | None) -> bool:
    """Whether an image built for `platforms` runs on `platform` (unknown either: yes)."""
    return not platforms or platform is None or platform in platforms


def undrivable(host: Host, gpus: Sequence[HostGpu]) -> list[HostGpu]:
    """The GPUs this host's driver cannot drive at all, whatever the image: too old for
    their architecture, or a branch after the last one that drives it."""
    if host.driver is None:
        return []
    driver = host.driver
    return [g for g in gpus if (g.floor and driver < g.floor.driver) or g.past_last_branch(driver)]


def _class_from_brand(brand: str | None) -> str | None:
    if brand is None:
        return None
    if brand in ("tesla", "nvidia"):
        # NVML reports H100, A100, GH200 and T4 with the brand NVIDIA; NVIDIA's own
        # forward-compatibility check (NVIDIA_REQUIRE_CUDA) accepts brand=tesla and
        # brand=nvidia alike.
        return "datacenter"
    if brand.startswith(("geforce", "titan")):
        return "consumer"
    if brand.startswith(("quadro", "nvidia_rtx", "nvs")):
        return "workstation"
    return None


def selected_gpus(spec: Spec, gpus: Sequence[HostGpu]) -> tuple[HostGpu, ...]:
    """The GPUs the spec will use: named ones (a named MIG instance's GPU), those with
    instances of the spec's MIG profile, none, or all (a count may land on any)."""
    request = spec.gpus
    if request.mode == "none":
        return ()
    if request.mode in ("devices", "mig"):
        chosen = [
            g
            for g in gpus
            if str(g.gpu.index) in request.devices
            or g.gpu.uuid in request.devices
            or any(m.uuid in request.devices for m in g.gpu.mig_devices)
            or any(m.profile == request.profile for m in g.gpu.mig_devices if request.profile)
        ]
        return tuple(chosen) if chosen else tuple(gpus)
    return tuple(gpus)


def effective_min_driver(row: ImageRow, matrix: Matrix) -> DriverVersion | None:
    """The row's stated minimum, raised to its CUDA major's floor; derived when unstated."""
    floors = []
    if row.min_driver:
        floors.append(row.min_driver)
    elif row.cuda:
        toolkit = matrix.toolkit(row.cuda)
        if toolkit:
            floors.append(toolkit.min_driver)
    if row.cuda:
        floor = matrix.minor_compat_floor(row.cuda)
        if floor:
            floors.append(floor)
    return max(floors) if floors else None


class _SpecChecks:
    """The spec's constraints, parsed once per resolve, with verdicts memoized by value."""

    def __init__(self, spec: Spec) -> None:
        names = {"version": FRAMEWORK_NAMES[spec.framework], "python": "Python", "cuda": "CUDA"}
        self.wanted: list[tuple[str, str, SpecifierSet, str, str]] = [
            (check, SPEC_FIELDS[check], constraint, getattr(spec, check), names[check])
            for check, constraint in (
                ("version", spec.version_spec),
                ("python", spec.python_spec),
                ("cuda", spec.cuda_spec),
            )
            if constraint is not None
        ]
        # Builds of one release share a verdict unless a constraint names a build.
        self.by_release = not any(selects_builds(w[2]) for w in self.wanted)
        self.verdicts: dict[tuple[str, str], bool] = {}
        self.rejections: dict[tuple[str, str | None], Rejection | None] = {}

    def __call__(self, row: ImageRow) -> list[Rejection]:
        out = []
        for check, attribute, constraint, written, what in self.wanted:
            key = (check, getattr(row, attribute))
            if key in self.rejections:
                rejection = self.rejections[key]
            else:
                rejection = self.rejections[key] = self._check(*key, constraint, written, what)
            if rejection is not None:
                out.append(rejection)
        return out

    def _check(
        self, check: str, value: str | None, constraint: SpecifierSet, written: str, what: str
    ) -> Rejection | None:
        if value is None:
            return Rejection(check, f"its {what} version is not recorded in the matrix")
        key = (check, release_of(value) if self.by_release else value)
        ok = self.verdicts.get(key)
        if ok is None:
            ok = self.verdicts[key] = matches(constraint, value)
        return None if ok else Rejection(check, f"has {what} {value}, not {written}")


NATIVE = "native"
MINOR = "minor-version compatibility"
FORWARD = "forward compatibility"


def _driver_check(
    row: ImageRow, matrix: Matrix, host: Host, gpus: Sequence[HostGpu], strict: bool = False
) -> tuple[Rejection | None, DriverVersion | None, str | None, str | None, bool]:
    """(rejection, minimum, route, mode, verified). The minimum is NVIDIA's stated minimum
    for the image, raised to its CUDA major's minor-version floor (525 for 12.x, 580 for
    13.x), for 12.x and 13.x alike. At or above the CUDA toolkit's own driver the image
    runs natively; below it, on that minimum, by CUDA minor-version compatibility
    (limited: PTX newer than the driver cannot be JIT-compiled); data-center GPUs below it
    may run by forward compatibility where NVIDIA supports it (`forward_verdict`), a route
    that is not `verified` where NVIDIA's documents disagree. `strict` (--strict-driver,
    the spec's `strict_driver`) takes native only: it refuses both compatibility routes,
    and an image whose toolkit's own driver is not recorded (native cannot be told)."""
    minimum = effective_min_driver(row, matrix)
    toolkit = matrix.toolkit(row.cuda) if row.cuda else None
    own = toolkit.min_driver if toolkit else None
    if strict and own is not None and (minimum is None or own > minimum):
        minimum = own
    if host.driver is None:
        return None, minimum, f"not checked ({host.without_driver()[0]})", None, True
    if minimum is None:
        why = "its minimum driver is not recorded in the matrix"
        return Rejection("driver", why), None, None, None, True
    driver = host.driver
    if strict and own is None:
        why = (
            f"CUDA {row.cuda or '(not recorded)'}'s own driver is not recorded in the matrix: "
            "strict_driver takes only images the driver runs natively"
        )
        return Rejection("driver", why), minimum, None, None, True
    if driver >= minimum:
        if own is None:
            return None, minimum, f"driver {host.driver} ≥ {minimum}", None, True
        if driver >= own:
            return None, minimum, f"driver {host.driver} ≥ {minimum}, native", NATIVE, True
        route = (
            f"driver {host.driver} ≥ {minimum} by CUDA minor-version compatibility (below "
            f"CUDA {row.cuda}'s own {own}: PTX newer than the driver cannot be JIT-compiled)"
        )
        return None, minimum, route, MINOR, True
    reason = f"needs driver ≥ {minimum} (this host has {host.driver})"
    if strict:  # native only: neither minor-version nor forward compatibility
        reason += f": CUDA {row.cuda}'s own driver, which strict_driver requires"
        return Rejection("driver", reason), minimum, None, None, True
    forward = forward_verdict(row, matrix, host.driver, gpus)
    if forward.route is not None:
        return None, minimum, forward.route, FORWARD, forward.verified
    if forward.why_not and forward.why_not.startswith("data-center GPUs also"):
        reason += f" ({forward.why_not})"
    elif forward.why_not:
        reason += f"; {forward.why_not}"
    return Rejection("driver", reason), minimum, None, None, True


@lru_cache(maxsize=4096)
def _cuda_supports(matrix: Matrix, cuda: str, cc: ComputeCapability) -> str | None:
    """None when CUDA `cuda` builds for compute capability `cc`, else why not."""
    version = parse_version(cuda)
    arch = matrix.architecture(cc)
    if arch is None:
        return None
    if arch.removed_in and version >= parse_version(arch.removed_in):
        return (
            f"CUDA {arch.removed_in} dropped {cc.sm} ({arch.architecture}); "
            f"this image has CUDA {cuda}"
        )
    if arch.added_in is None or version >= parse_version(arch.added_in):
        return None
    for other in matrix.architectures:
        older = other.compute_capability
        if older.major == cc.major and older.minor < cc.minor:
            native = other.added_in is None or version >= parse_version(other.added_in)
            kept = other.removed_in is None or version < parse_version(other.removed_in)
            if native and kept:
                return None
    needs = f"{arch.architecture} ({cc.sm}) needs CUDA ≥ {arch.added_in}"
    return f"{needs}; this image has CUDA {cuda}"


def _gpu_checks(row: ImageRow, matrix: Matrix, gpus: Sequence[HostGpu]) -> list[Rejection]:
    out = []
    reported: set[str] = set()
    for gpu in gpus:
        cc = gpu.compute_capability
        if cc is None or gpu.name in reported:
            continue
        if row.min_compute_capability and cc < row.min_compute_capability:
            out.append(
                Rejection(
                    "gpu",
                    f"is built for compute capability ≥ {row.min_compute_capability}; "
                    f"{gpu.name} is {cc} ({cc.sm})",
                )
            )
            reported.add(gpu.name)
            continue
        if row.cuda:
            why = _cuda_supports(matrix, row.cuda, cc)
            if why:
                out.append(Rejection("gpu", f"cannot run on {gpu.name}: {why}"))
                reported.add(gpu.name)
    return out


def evaluate(
    spec: Spec,
    matrix: Matrix,
    host: Host,
    gpus: Sequence[HostGpu],
    rows: Sequence[ImageRow],
    pins: Sequence[Pin] = (),
) -> tuple[Candidate, ...]:
    """Every check of every row against the spec and the host.

    Verdicts depend on a few fields of a row, and matrices repeat those values a lot,
    so each distinct combination is checked once.
    """
    spec_checks = _SpecChecks(spec)
    # A driver that cannot drive a GPU at all rejects every image, before anything else.
    drive = [Rejection("driver", drive_reason(host, g)) for g in undrivable(host, gpus)]
    # Keyed by the values as written: 550 and 550.0 are one driver, but a verdict's
    # words (its minimum, its route) name the row's own spelling.
    host_memo: dict[
        tuple[str | None, ...],
        tuple[list[Rejection], DriverVersion | None, str | None, str | None, bool],
    ] = {}
    out = []
    for row in rows:
        spec_rejections = spec_checks(row)
        if pins:
            spec_rejections += [Rejection("package", why) for why in pin_reasons(row, pins)]
        host_key = (
            row.release,  # forward compatibility weighs a branch's end against it
            row.cuda,
            as_written(row.min_driver),
            " ".join(map(str, row.forward_compat)),
            as_written(row.min_compute_capability),
            " ".join(row.platforms),
        )
        host_verdict = host_memo.get(host_key)
        if host_verdict is None:
            driver_rejection, minimum, route, mode, verified = _driver_check(
                row, matrix, host, gpus, spec.strict_driver
            )
            host_rejections = [*drive] or ([driver_rejection] if driver_rejection else [])
            host_rejections.extend(_gpu_checks(row, matrix, gpus))
            if not platform_fits(row.platforms, host.platform):
                listed = ", ".join(row.platforms)
                host_rejections.append(
                    Rejection("platform", f"is built for {listed}; this host is {host.platform}")
                )
            host_verdict = host_memo[host_key] = (
                host_rejections,
                minimum,
                route,
                mode,
                verified,
            )
        rejections, minimum, route, mode, verified = host_verdict
        out.append(Candidate(row, (*spec_rejections, *rejections), minimum, route, mode, verified))
    return tuple(out)


def resolve(
    spec: Spec,
    matrix: Matrix,
    host: Host,
    prefer: str | None = None,
    pins: Sequence[Pin] = (),
    *,
    newest: bool = False,
) -> Resolution:
    """The newest image of the spec's framework that fits the spec and the host, among
    those gpuenv can vouch for (framework version recorded, driver route not a disputed
    forward compatibility), unless `newest`: then the newest of all; newer fitting
    images passed over are named in a warning.

    `prefer` names an image (the one already locked): if it still fits, it is kept, so
    editing an unrelated field of the spec never moves the image. `pins` are the
    project's pins on packages the image provides (`gpuenv.resolution.pins`).
    """
    rows = matrix.images_for(spec.framework, spec.base)
    all_gpus = classify_gpus(host, matrix)
    gpus = selected_gpus(spec, all_gpus)
    candidates = evaluate(spec, matrix, host, gpus, rows, pins)
    jetson = [g for g in gpus if g.gpu_class == "embedded"]
    if jetson:
        error = not_for_jetson(jetson)
        error.candidates = candidates
        raise error
    stuck = undrivable(host, gpus)
    if stuck:
        error = cannot_drive(host, stuck)
        error.candidates = candidates
        raise error
    notes: list[str] = []
    chosen = next((c for c in candidates if c.ok and c.row.image == prefer), None)
    chosen = chosen or _newest(spec, candidates, newest, notes)
    if chosen is None:
        error = (
            conflicting_pins(spec, pins, rows)
            or pins_unsatisfiable(pins, candidates)
            or unresolvable(spec, host, candidates, gpus, matrix.notice(spec.framework))
        )
        elsewhere = (
            other_family_has(spec, matrix)
            if candidates and all(c.rejected_by("version") for c in candidates)
            else None
        )
        if elsewhere and not error.hint:
            error.hint = elsewhere
        elif elsewhere:
            error.hint = f"{error.hint}; or {elsewhere}"
        error.candidates = candidates
        raise error
    warnings = (
        *notes,
        *host_lacks(spec, host, all_gpus),
        *driver_unheard_of(host, matrix),
        *warnings_for(chosen, host, gpus),
    )
    return Resolution(spec, host, chosen, candidates, gpus, warnings)


FAMILY_NAMES = {"ngc": "NVIDIA's NGC images", "dockerhub": "Docker Hub's official images"}


def other_family_has(spec: Spec, matrix: Matrix) -> str | None:
    """Where the framework version the spec asks for is in another family's images
    (TensorFlow 2.20 on Docker Hub, not NGC): the `base:` that reaches it, or None."""
    if spec.version_spec is None:
        return None
    for family, name in FAMILY_NAMES.items():
        if family == spec.base:
            continue
        rows = [
            row
            for row in matrix.images_for(spec.framework, family)
            if row.framework_version and matches(spec.version_spec, row.framework_version)
        ]
        if rows:
            return (
                f"{name} have {FRAMEWORK_NAMES[spec.framework]} {spec.version}: "
                f"`base: {family}` in gpuenv.yaml (such as {rows[0].label})"
            )
    return None


def driver_unheard_of(host: Host, matrix: Matrix) -> list[str]:
    """A driver far newer than any toolkit's in the matrix (`--driver 9999.1`): every
    image counts as native on it, which is true only if the version is; said."""
    if host.driver is None:
        return []
    newest = max((t.min_driver for t in matrix.toolkits), default=None)
    if newest is None or host.driver.branch < newest.branch + 100:
        return []
    return [
        f"driver {host.driver} is far newer than any driver the matrix knows (the newest "
        f"CUDA toolkit needs {newest}): every image counts as native on it; check the "
        "version (`nvidia-smi --query-gpu=driver_version --format=csv`)"
    ]


def host_lacks(spec: Spec, host: Host, gpus: Sequence[HostGpu]) -> list[str]:
    """What the spec's `gpus:` asks that the host (known or described) does not have: a
    GPU index or UUID it lacks, more GPUs than it has. Said, with the fix; the image is
    then checked against all its GPUs (a lock may be made for another machine)."""
    if not gpus:
        return []
    request = spec.gpus
    where = host.describe()
    if request.mode == "devices":
        known = {str(g.gpu.index) for g in gpus} | {g.gpu.uuid for g in gpus if g.gpu.uuid}
        known |= {m.uuid for g in gpus for m in g.gpu.mig_devices}
        missing = [d for d in request.devices if d not in known]
        if missing:
            has = ", ".join(str(g.gpu.index) for g in gpus)
            return [
                f"gpuenv.yaml's gpus names GPU {', '.join(missing)}, which this host does not "
                f"have (GPU {has}; {where}): the image was checked against all its GPUs; "
                "fix `gpus:`, or plan for the host that has it (--gpu, GPUENV_HOST_FILE)"
            ]
    if request.mode == "count" and request.count and request.count > len(gpus):
        return [
            f"gpuenv.yaml asks for {request.count} GPUs; this host has {len(gpus)} ({where}): "
            "a run here waits for ever or fails; ask for fewer, or plan for the host that "
            "has them"
        ]
    return []


def _newest(
    spec: Spec, candidates: Sequence[Candidate], newest: bool, notes: list[str]
) -> Candidate | None:
    """The newest fitting candidate gpuenv can vouch for: its framework version recorded,
    and its driver route not an unverified forward compatibility; the newest of all with
    `newest`, or where none qualifies. What it passes over, and why, or an unrecorded
    version it takes, goes into `notes`."""
    fitting = [c for c in candidates if c.ok]
    if not fitting:
        return None
    name = FRAMEWORK_NAMES.get(spec.framework, spec.framework)

    def doubt(candidate: Candidate) -> str | None:
        if spec.framework != "none" and not candidate.row.framework_version:
            return f"their {name} version is not recorded in the matrix"
        if not candidate.route_verified:
            return "they run here only by a forward compatibility NVIDIA's documents disagree on"
        return None

    vouched = [c for c in fitting if doubt(c) is None]
    chosen = fitting[0] if newest or not vouched else vouched[0]
    passed: dict[str, list[str]] = {}
    for candidate in fitting[: fitting.index(chosen)]:
        passed.setdefault(doubt(candidate) or "", []).append(candidate.row.tag)
    for why, tags in passed.items():
        listed = ", ".join(tags[:4]) + (", …" if len(tags) > 4 else "")
        record = f" ({how_to_record(spec.framework)})" if "not recorded" in why else ""
        notes.append(
            f"newer images fit but {why} ({listed}): not chosen, so the lock says what it "
            f"runs; `--newest` takes the newest of them{record}"
        )
    if spec.framework != "none" and not chosen.row.framework_version:
        notes.append(
            f"the {name} version of {chosen.row.image} is not recorded in the matrix: "
            f"the lock says unknown; {how_to_record(spec.framework)}"
        )
    return chosen
