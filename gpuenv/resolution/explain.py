"""Why a resolution came out as it did, in the user's words: the warnings on a chosen
image, and for no solution the nearest candidates and the smallest change that fits."""

from __future__ import annotations

import re
from collections.abc import Sequence

from gpuenv.common.versions import DriverVersion, parse_version, series
from gpuenv.errors import ResolutionError
from gpuenv.host.machine import Host
from gpuenv.matrix.load import FRAMEWORK_NAMES, ImageRow
from gpuenv.matrix.sync import how_to_record
from gpuenv.project.spec import Spec
from gpuenv.resolution.verdicts import Candidate, HostGpu

SPEC_CHECKS = ("version", "python", "cuda")
RELEVANT_FIELDS = ("framework_version", "cuda", "python", "min_driver", "min_compute_capability")
SPEC_FIELDS = {"version": "framework_version", "python": "python", "cuda": "cuda"}


def framework_label(row: ImageRow) -> str:
    return FRAMEWORK_NAMES[row.framework]


def describe_request(spec: Spec) -> str:
    """``PyTorch 2.4 with Python 3.10 and CUDA >=12.1``."""
    name = FRAMEWORK_NAMES[spec.framework]
    head = f"{name} {spec.version}" if spec.version and spec.framework != "none" else name
    if spec.framework == "none":
        head = "a CUDA base image"
    extra = []
    if spec.python:
        extra.append(f"Python {spec.python}")
    if spec.cuda:
        extra.append(f"CUDA {spec.cuda}")
    return head + (f" with {' and '.join(extra)}" if extra else "")


# Evidence in the user's words: never the research tags of the matrix notes.
FIELD_WORDS = {
    "framework_version": "the framework version",
    "cuda": "the CUDA version",
    "cudnn": "the cuDNN version",
    "python": "the Python version",
    "ubuntu": "the Ubuntu version",
    "min_driver": "the minimum driver",
    "forward_compat": "the forward-compatible driver branches",
    "min_compute_capability": "the minimum compute capability",
    "platforms": "the platforms it is built for",
}


def _listed(names: Sequence[str]) -> str:
    words = [FIELD_WORDS.get(n, n) for n in names]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def warnings_for(chosen: Candidate, host: Host, gpus: Sequence[HostGpu]) -> list[str]:
    row = chosen.row
    out = [f"{row.image}: {row.caveat}"] if row.caveat else []
    relied = [f for f in RELEVANT_FIELDS if f in row.unverified]
    if "platforms" in row.unverified and row.platforms and host.platform:
        relied.append("platforms")  # the platform check relied on them
    if row.evidence == "unverified" or relied:
        what = _listed(relied) if relied else "its data"
        verb = "is" if len(relied) <= 1 else "are"
        whose = "NVIDIA's documents" if row.family == "ngc" else "its publisher's documents"
        out.append(
            f"{row.label}: {what} {verb} unverified (not confirmed by {whose}); "
            "check the image's release notes before relying on it"
        )
    if host.driver is None:
        why, fix = host.without_driver()
        out.append(
            f"{why}: driver and GPU checks were skipped "
            f"(this image needs driver ≥ {chosen.min_driver or 'unknown'}); {fix}"
        )
    elif chosen.driver_route and not chosen.route_verified:
        out.append(
            "forward compatibility here is unverified: NVIDIA's documents do not agree, or "
            "do not say, that this driver branch runs this image (the host line says "
            "which); try the image on this host before relying on it, or move to a branch "
            "they all list"
        )
    elif chosen.driver_route and chosen.driver_route.startswith("CUDA forward"):
        out.append(
            f"runs through {chosen.driver_route}; the container's compat libraries are "
            "used, and consumer GPUs would fail with error 804"
        )
    elif not gpus and host.driver is not None and not host.gpus:
        out.append(
            "no GPUs are known for this host: compute-capability checks were skipped "
            "(describe them with --gpu MODEL)"
        )
    # Every NGC framework image is built for linux/amd64; another platform is checked
    # only where the row records its platforms (`gpuenv matrix sync` reads them).
    if host.platform and host.platform != "linux/amd64" and not row.platforms:
        out.append(
            f"platform not checked: the matrix does not record which platforms {row.image} "
            f"is built for, and this host is {host.platform}; `gpuenv matrix sync` reads "
            "them from the registry"
        )
    unknown = sorted({g.name for g in gpus if g.compute_capability is None})
    if unknown:
        out.append(f"compute capability of {', '.join(unknown)} is unknown: not checked")
    return out


def unresolvable(
    spec: Spec,
    host: Host,
    candidates: Sequence[Candidate],
    gpus: Sequence[HostGpu],
    notice: str | None = None,
) -> ResolutionError:
    request = describe_request(spec)
    if not candidates:
        return ResolutionError(
            f"the matrix has no {spec.base} images for {FRAMEWORK_NAMES[spec.framework]}"
        )
    message = f"no image fits {request} on this host: {host.describe()}"
    explanation: list[str] = []
    spec_ok = [c for c in candidates if not c.rejected_by(*SPEC_CHECKS)]
    if spec_ok:
        nearest = sorted(spec_ok, key=lambda c: len(c.rejections))[:3]
    else:
        explanation.append(f"no image in the matrix has {request}; the closest:")
        nearest = closest(spec, candidates)
    for candidate in nearest:
        reasons = "; ".join(r.reason for r in candidate.rejections)
        explanation.append(f"{candidate.row.label} ({candidate.row.image}) {reasons}")
    if notice and spec.version and all(c.rejected_by("version") for c in candidates):
        explanation.append(notice)
    fixes = _fixes(spec, candidates, spec_ok, gpus)
    hint = "; or ".join(fixes) if fixes else None
    if hint:
        hint = hint[0].upper() + hint[1:]
    return ResolutionError(message, explanation, hint=hint)


def closest(spec: Spec, candidates: Sequence[Candidate], count: int = 3) -> list[Candidate]:
    """The candidates nearest to what the spec asks, by version distance: the framework
    version first, then Python, then CUDA (only those the spec sets); one image per
    set of their series (2.1, 3.10), the newest of each; a value the matrix does not
    record counts as farthest. Not the newest images: for torch 1.4 the closest are the
    oldest PyTorch images, never 26.10."""
    asked = [(c, _release_number(getattr(spec, c))) for c in SPEC_CHECKS if getattr(spec, c)]

    def distance(candidate: Candidate) -> tuple[float, ...]:
        out: list[float] = []
        for check, wanted in asked:
            value = _spec_value(candidate.row, check)
            out.append(abs(_release_number(value) - wanted) if value else float("inf"))
        return (*out, len(candidate.rejections))

    chosen: list[Candidate] = []
    seen: set[tuple[str | None, ...]] = set()
    for candidate in sorted(candidates, key=distance):  # stable: newest first on ties
        versions = tuple(
            series(value) if (value := _spec_value(candidate.row, check)) else None
            for check, _ in asked
        )
        if versions not in seen:
            seen.add(versions)
            chosen.append(candidate)
    return chosen[:count]


def _spec_value(row: ImageRow, check: str) -> str | None:
    value: str | None = getattr(row, SPEC_FIELDS[check])
    return value


def _anchor(spec: Spec, check: str) -> tuple[int, int] | None:
    """The version a constraint is about (``>=2.4`` -> 2.4), to measure how far a row is."""
    constraint = getattr(spec, f"{check}_spec")
    for specifier in constraint or ():
        release = parse_version(specifier.version.rstrip(".*")).release
        return (release[0], release[1] if len(release) > 1 else 0)
    return None


def _series_tuple(text: str) -> tuple[int, int]:
    release = parse_version(text).release
    return (release[0], release[1] if len(release) > 1 else 0)


def _fixes(
    spec: Spec,
    candidates: Sequence[Candidate],
    spec_ok: Sequence[Candidate],
    gpus: Sequence[HostGpu] = (),
) -> list[str]:
    """The smallest changes that make an image fit: a driver upgrade (never to one below
    what the GPUs need), or looser constraints."""
    fixes = []
    needs = [(c.min_driver, c) for c in spec_ok if c.only_rejected_by("driver") and c.min_driver]
    if needs:
        least, best = min(needs, key=lambda pair: pair[0])
        floors: list[DriverVersion] = [g.floor.driver for g in gpus if g.floor]
        target = max([least, *floors])
        fixes.append(f"upgrade the NVIDIA driver to ≥ {target} ({best.row.label} then fits)")
    host_ok = [c for c in candidates if not c.rejected_by("driver", "gpu", "platform")]
    by_changes: dict[tuple[str, ...], list[Candidate]] = {}
    for candidate in host_ok:
        changed = tuple(r.check for r in candidate.rejections if r.check in SPEC_CHECKS)
        if changed and all(_spec_value(candidate.row, c) for c in changed):
            by_changes.setdefault(changed, []).append(candidate)
    fewest = min((len(k) for k in by_changes), default=0)
    for changed, options in by_changes.items():
        if len(changed) != fewest:
            continue

        def distance(c: Candidate, changed: tuple[str, ...] = changed) -> int:
            total = 0
            for check in changed:
                anchor = _anchor(spec, check)
                value = _series_tuple(_spec_value(c.row, check) or "0")
                if anchor:
                    total += abs((value[0] - anchor[0]) * 1000 + value[1] - anchor[1])
            return total

        best = min(options, key=distance)  # candidates are newest first: ties go to newer
        parts = [_change_text(spec, best.row, check) for check in changed]
        fixes.append(f"allow {' and '.join(parts)} ({best.row.label}, {best.row.image})")
    fixes.extend(_version_fixes(spec, candidates))
    return fixes[:3]


def _release_number(text: str) -> int:
    """``2.15`` -> 2_015_000, ``0.4.30`` -> 4_030: versions as one number, to rank by
    closeness (the first digits of a constraint such as '>=2.1' are used)."""
    parts = [int(p) for p in re.findall(r"\d+", text)[:3]]
    parts += [0] * (3 - len(parts))
    return parts[0] * 1_000_000 + parts[1] * 1_000 + parts[2]


def _could_have(version: str, rows: Sequence[ImageRow]) -> list[str]:
    """The tags of the rows without a recorded framework version that could have
    `version`: NGC releases never go back in version, so an unrecorded row's version
    lies between its recorded neighbours' (26.10 after 26.09's torch 2.14 cannot be
    torch 1.9). Rows are newest first."""
    wanted = _release_number(version)
    out = []
    for index, row in enumerate(rows):
        if row.framework_version:
            continue
        newer = next((r for r in reversed(rows[:index]) if r.framework_version), None)
        older = next((r for r in rows[index + 1 :] if r.framework_version), None)
        low = _release_number(older.framework_version or "") if older else None
        high = _release_number(newer.framework_version or "") if newer else None
        if (low is None or wanted >= low) and (high is None or wanted <= high):
            out.append(row.tag)
    return out


def _version_fixes(spec: Spec, candidates: Sequence[Candidate]) -> list[str]:
    """When the framework version pin is what nothing satisfies: drop it where no image
    records a version, else name the nearest versions NVIDIA shipped."""
    if not spec.version or spec.framework == "none" or not candidates:
        return []
    if any(not c.rejected_by("version") for c in candidates):
        return []
    label = FRAMEWORK_NAMES[spec.framework]
    known = [c.row for c in candidates if c.row.framework_version]
    unknown = _could_have(spec.version, [c.row for c in candidates])
    gap = (
        f" (the {label} version of {len(unknown)} of {len(candidates)} images is not "
        f"recorded: {', '.join(unknown[:4])}{', …' if len(unknown) > 4 else ''}; "
        f"{how_to_record(spec.framework)})"
        if unknown
        else ""
    )
    if not known:
        return [
            f"drop the {label} version pin (version: '{spec.version}'): no {label} image in "
            f"the matrix records its {label} version (`gpuenv matrix {spec.framework}`){gap}"
        ]
    wanted = _release_number(spec.version)
    by_release: dict[str, str] = {}
    for row in known:  # newest first: each release keeps its newest image
        by_release.setdefault(parse_version(row.framework_version or "0").base_version, row.tag)

    def distance(item: tuple[str, str]) -> int:
        return abs(_release_number(item[0]) - wanted)

    nearest = sorted(by_release.items(), key=distance)[:3]
    shown = ", ".join(f"{version} ({tag})" for version, tag in nearest)
    if unknown:
        return [
            f"no {label} image whose version the matrix records has {label} {spec.version}; "
            f"the nearest recorded: {shown}{gap}"
        ]
    who = "NVIDIA" if spec.base == "ngc" else "its publisher"
    return [f"no {label} image has {label} {spec.version}; the nearest {who} shipped: {shown}"]


def _change_text(spec: Spec, row: ImageRow, check: str) -> str:
    value = _spec_value(row, check) or "0"
    wanted = series(value)
    anchor = _anchor(spec, check)
    op = ""
    if anchor is not None:
        op = "≥ " if _series_tuple(value) > anchor else "≤ "
    what = {"version": framework_label(row), "python": "Python", "cuda": "CUDA"}[check]
    return f"{what} {op}{wanted} ({check}: '{wanted}')"


def drive_reason(host: Host, gpu: HostGpu) -> str:
    """Why the driver cannot drive `gpu`, with the branch it needs."""
    kind = f"{gpu.architecture}, " if gpu.architecture else ""
    what = f"driver {host.driver} cannot drive the {gpu.name} ({kind}compute capability "
    if gpu.past_last_branch(host.driver):
        assert gpu.ceiling is not None
        return (
            f"{what}{gpu.compute_capability}): R{gpu.ceiling.branch} is the last branch "
            f"that drives it ({gpu.ceiling.why})"
        )
    assert gpu.floor is not None
    return (
        f"{what}{gpu.compute_capability}): it needs R{gpu.floor.driver.branch} or "
        f"newer (≥ {gpu.floor.driver}; {gpu.floor.why})"
    )


def cannot_drive(host: Host, gpus: Sequence[HostGpu]) -> ResolutionError:
    """No image can help: the driver predates the GPUs' architecture, or comes after the
    last branch that drives it."""
    names = ", ".join(sorted({g.name for g in gpus}))
    old = [g for g in gpus if g.past_last_branch(host.driver)]
    hints = []
    if old:
        last = min(g.ceiling.branch for g in old if g.ceiling)
        generations = ", ".join(sorted({g.architecture or g.name for g in old}))
        hints.append(
            f"stay on R{last} (its latest release) for the {generations} GPUs, or move to "
            "GPUs of a newer generation; no image and no forward compatibility package "
            "brings an architecture back to a branch that dropped it"
        )
    floors = [g.floor.driver for g in gpus if g.floor and g not in old]
    if floors:
        needed = max(floors)
        hints.append(
            f"upgrade the NVIDIA driver to R{needed.branch} or newer (≥ {needed}); "
            "CUDA forward compatibility cannot help here: it brings newer CUDA libraries, "
            "not support for a newer GPU"
        )
    return ResolutionError(
        f"this NVIDIA driver ({host.driver}) cannot drive the {names}: no image can run on it",
        [drive_reason(host, g) for g in gpus],
        hint="; ".join(hints),
    )


def not_for_jetson(gpus: Sequence[HostGpu]) -> ResolutionError:
    """Jetson modules have integrated GPUs; the matrix's NGC images are dGPU builds."""
    names = ", ".join(sorted({g.name for g in gpus}))
    return ResolutionError(
        f"NGC dGPU images do not run on Jetson: the {names} is an integrated GPU",
        [
            "the images in gpuenv's matrix are built for discrete GPUs (x86_64 and Arm "
            "servers); Jetson needs NVIDIA's iGPU builds"
        ],
        hint="use NVIDIA's Jetson containers (the -igpu tags of NGC images 23.11 to 26.02, "
        "NVIDIA's multi-arch images after, or nvcr.io/nvidia/l4t-jetpack); gpuenv does not "
        "resolve those yet",
    )
