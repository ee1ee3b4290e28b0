"""A base image of the team's own (`base: registry.example.com/team/train:2025.03`): the
matrix row gpuenv makes of it from what the image says of itself, so it is checked
against the host the way a matrix row is.

Two readings, both of the image itself: its configuration (the environment NVIDIA's
CUDA images set: ``CUDA_VERSION``, ``NVIDIA_REQUIRE_CUDA``, ``CUDNN_VERSION``; a
framework's version variable; ``PYTHON_VERSION`` as python images set it; the Ubuntu
base's labels), and a probe: `PROBE` run with the image's Python, which imports the
spec's framework and says its version, the CUDA and cuDNN it was built with and the
GPU architectures it carries code for. The configuration wins where both speak (it is
what the NVIDIA runtime and `gpuenv build` check the image by), and a disagreement is
said. What neither says stays unknown, and the resolver's warning names it.
Pure: the engine work is `gpuenv.images.own_base`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuenv.common import nesting
from gpuenv.common.versions import ComputeCapability, DriverVersion, is_version
from gpuenv.matrix.model import ImageRow
from gpuenv.matrix.sync import (
    VERSION_ENV,
    environment,
    lowest_compute_capability,
    parse_requirement,
    release_text,
)

# What a row of an own base can know, in the order messages name them.
FIELDS = ("framework_version", "cuda", "cudnn", "python", "min_compute_capability", "ubuntu")
FIELD_NAMES = {
    "framework_version": "framework version",
    "cuda": "CUDA version",
    "cudnn": "cuDNN version",
    "python": "Python version",
    "min_compute_capability": "GPU architectures",
    "ubuntu": "Ubuntu version",
}

# Run in the image with its own Python; prints one JSON object. The framework to import
# is its first argument (never interpolated into the code). Nothing runs on a GPU:
# torch's architecture list comes from its build flags, which need none.
PROBE = """\
import json, platform, sys
out = {"python": platform.python_version()}
name = sys.argv[1] if len(sys.argv) > 1 else ""
try:
    if name == "torch":
        import torch
        out["framework"] = torch.__version__
        out["cuda"] = torch.version.cuda
        cudnn = getattr(torch.backends, "cudnn", None)
        out["cudnn"] = cudnn.version() if cudnn is not None else None
        flags = getattr(torch._C, "_cuda_getArchFlags", None)
        out["arch"] = flags() if flags is not None else None
    elif name == "tensorflow":
        import tensorflow
        out["framework"] = tensorflow.__version__
        info = tensorflow.sysconfig.get_build_info()
        out["cuda"] = info.get("cuda_version")
        out["cudnn"] = info.get("cudnn_version")
        out["arch"] = info.get("cuda_compute_capabilities")
    elif name == "jax":
        import jax
        out["framework"] = jax.__version__
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"[:300]
print("GPUENV-PROBE " + json.dumps(out, default=str))
"""
PROBE_MARK = "GPUENV-PROBE "
PROBE_MODULES = {"pytorch": "torch", "tensorflow": "tensorflow", "jax": "jax", "none": ""}
# Framework version variables some images set besides NGC's (`sync.VERSION_ENV`).
_MORE_VERSION_ENV = {"tensorflow": ("TF_VERSION",), "jax": ("JAX_VERSION",)}


@dataclass(frozen=True)
class Reading:
    """What one look at the image found: field -> value, and field -> where from."""

    values: dict[str, str]
    sources: dict[str, str]
    forward_compat: tuple[str, ...] = ()
    said: str = ""  # what the probe reported going wrong, if it did


def from_config(framework: str, config: Mapping[str, Any] | None) -> Reading:
    """What an image's configuration (the engine's `Config`: Env, Labels) states."""
    env, labels = environment({"config": dict(config or {})})
    values: dict[str, str] = {}
    sources: dict[str, str] = {}

    def put(field: str, value: str | None, source: str) -> None:
        if value and field not in values:
            values[field] = value
            sources[field] = source

    for name in (*VERSION_ENV.get(framework, ()), *_MORE_VERSION_ENV.get(framework, ())):
        text = env.get(name, "").strip()
        put("framework_version", text if is_version(text) else None, f"the image's {name}")
    put("cuda", release_text(env.get("CUDA_VERSION", ""), parts=3), "the image's CUDA_VERSION")
    put("cudnn", release_text(env.get("CUDNN_VERSION", "")), "the image's CUDNN_VERSION")
    python = release_text(env.get("PYTHON_VERSION", ""))
    put("python", python, "the image's PYTHON_VERSION")
    put(
        "min_compute_capability",
        lowest_compute_capability(env.get("CUDA_ARCH_LIST", "")),
        "the image's CUDA_ARCH_LIST",
    )
    if labels.get("org.opencontainers.image.ref.name") == "ubuntu":
        ubuntu = release_text(labels.get("org.opencontainers.image.version", ""))
        put("ubuntu", ubuntu, "its Ubuntu base's org.opencontainers.image.version label")
    requirement = parse_requirement(env.get("NVIDIA_REQUIRE_CUDA", ""))
    return Reading(values, sources, requirement.branches)


def probe_answer(logs: str) -> Mapping[str, Any] | None:
    """The probe's JSON object out of a container's output; None when it printed none."""
    for line in reversed(logs.splitlines()):
        if line.startswith(PROBE_MARK):
            try:
                data = nesting.loads(json.loads, line[len(PROBE_MARK) :])
            except ValueError:
                return None
            return data if isinstance(data, dict) else None
    return None


def from_probe(framework: str, answer: Mapping[str, Any] | None) -> Reading:
    """What the probe found: the Python it ran with, and what the framework says of
    itself (``torch.version.cuda``, TensorFlow's build info)."""
    if not answer:
        return Reading({}, {})
    module = PROBE_MODULES.get(framework, "")
    values: dict[str, str] = {}
    sources: dict[str, str] = {}
    python = _text(answer.get("python"))
    if python and is_version(python):
        values["python"] = ".".join(python.split(".")[:3])
        sources["python"] = "the image's python3 (probe)"
    version = _text(answer.get("framework"))
    if module and version and is_version(version):
        values["framework_version"] = version
        sources["framework_version"] = f"{module}.__version__ (probe)"
    cuda = release_text(_text(answer.get("cuda")) or "", parts=3)
    if module in ("torch", "tensorflow") and cuda:
        values["cuda"] = cuda
        where = "torch.version.cuda" if module == "torch" else "tf.sysconfig.get_build_info()"
        sources["cuda"] = f"{where} (probe): the CUDA {module} was built with"
    cudnn = _cudnn(answer.get("cudnn"))
    if module in ("torch", "tensorflow") and cudnn:
        values["cudnn"] = cudnn
        sources["cudnn"] = f"{module}'s cuDNN (probe)"
    arch = _arches(answer.get("arch"))
    if module in ("torch", "tensorflow") and arch:
        values["min_compute_capability"] = arch
        sources["min_compute_capability"] = f"the GPU code {module} carries (probe)"
    said = _text(answer.get("error")) or ""
    return Reading(values, sources, said=said[:300])


def _text(value: Any) -> str | None:
    return str(value).strip() if isinstance(value, str | int | float) and str(value) else None


def _cudnn(value: Any) -> str | None:
    """torch says 90100 (9.1.0); TensorFlow says "9" or "9.3.0"."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        major, rest = divmod(value, 10000) if value >= 10000 else divmod(value, 1000)
        minor, patch = divmod(rest, 100)
        return f"{major}.{minor}.{patch}"
    text = _text(value)
    return text if text and re.match(r"^\d+(\.\d+){0,3}$", text) else None


def _arches(value: Any) -> str | None:
    """``['sm_80', 'sm_90', 'compute_90']`` (torch) or ``['compute_80', ...]`` (TF) ->
    the lowest compute capability, ``8.0``."""
    if not isinstance(value, list | tuple | str):
        return None
    items = value.split() if isinstance(value, str) else [str(v) for v in value]
    found = []
    for item in items:
        match = re.match(r"^(?:sm|compute)_(\d+?)(\d)a?$", item.strip())
        if match:
            found.append(f"{int(match.group(1))}.{match.group(2)}")
    return lowest_compute_capability(" ".join(found)) if found else None


def combined(config: Reading, probe: Reading) -> Reading:
    """The config's reading, with what only the probe found added; where both name a
    different version, the config's stands and `said` tells the probe's."""
    values = {**probe.values, **config.values}
    sources = {**probe.sources, **config.sources}
    differ = [
        f"{FIELD_NAMES[f]}: {config.sources[f]} says {config.values[f]}, "
        f"{probe.sources[f]} {probe.values[f]}"
        for f in FIELDS
        if f in config.values and f in probe.values and not _same(config.values[f], probe.values[f])
    ]
    said = "; ".join([*differ, *([probe.said] if probe.said else [])])
    return Reading(values, sources, config.forward_compat, said)


def _same(a: str, b: str) -> bool:
    """12.1 and 12.1.105 are the same CUDA; 3.11 and 3.11.9 the same Python."""
    left, right = a.split("+")[0].split("."), b.split("+")[0].split(".")
    width = min(len(left), len(right))
    return left[:width] == right[:width]


def own_row(
    framework: str,
    reference: str,
    reading: Reading,
    toolkit_floor: Callable[[str], DriverVersion | None],
    platforms: tuple[str, ...] = (),
) -> ImageRow:
    """The matrix row of `reference` (the spec's `base`, with its tag) from `reading`:
    its driver minimum is its CUDA toolkit's own driver (`toolkit_floor`, the matrix's
    cuda table), as for any image; evidence "image" (the image said it)."""
    repository, _, tag = reference.partition("@")[0].rpartition(":")
    values = reading.values
    cuda = values.get("cuda")
    read = "; ".join(f"{FIELD_NAMES[f]} from {reading.sources[f]}" for f in FIELDS if f in values)
    unknown = [FIELD_NAMES[f] for f in FIELDS if f not in values]
    note = f"read from the image: {read or 'nothing'}"
    if unknown:
        note += f"; not stated by the image: {', '.join(unknown)}"
    if reading.said:
        note += f"; {reading.said}"
    return ImageRow(
        framework=framework,
        family=reference,  # the resolver takes the rows whose family is `Spec.base`
        repository=repository,
        tag=tag,
        release=None,
        framework_version=values.get("framework_version") if framework != "none" else None,
        cuda=cuda,
        cudnn=values.get("cudnn"),
        python=".".join(values["python"].split(".")[:2]) if values.get("python") else None,
        ubuntu=values.get("ubuntu"),
        min_driver=toolkit_floor(cuda) if cuda else None,
        forward_compat=tuple(map(DriverVersion.parse, reading.forward_compat)),
        min_compute_capability=_capability(values.get("min_compute_capability")),
        evidence="image",
        unverified=(),
        note=note,
        source=reference,
        platforms=platforms,
        framework_version_unknown=(
            "" if values.get("framework_version") else "not stated by the image"
        ),
    )


def unknowns(row: ImageRow) -> list[tuple[str, str]]:
    """What gpuenv could not read from an own base: (what, and what that leaves
    unchecked; how the image can say it)."""
    module = PROBE_MODULES.get(row.framework, "")
    out = []
    if row.cuda is None:
        out.append(("its CUDA version (no driver check was made)", "ENV CUDA_VERSION=12.4.1"))
    if module and row.framework_version is None:
        out.append(
            (
                "its framework version (`version:` and the project's pins went unchecked)",
                f"a {module} that python3 imports",
            )
        )
    if row.python is None:
        out.append(("its Python version", "python3 on PATH"))
    if row.min_compute_capability is None:
        out.append(
            (
                "the GPU architectures its code is built for (only its CUDA's were checked)",
                'ENV CUDA_ARCH_LIST="8.0 9.0" (the compute capabilities it is built for)',
            )
        )
    return out


def _capability(text: str | None) -> ComputeCapability | None:
    """The lowest compute capability the image builds for, as read (None: not stated)."""
    return ComputeCapability.parse(text) if text else None
