"""Compare what gpuenv reads of this machine's GPUs with what nvidia-smi says, and print
one table (run by scripts/gpu-check.sh, with the Python of a venv that has gpuenv).

Stdlib only. Each gpuenv reading is taken right before an nvidia-smi query of its own,
so live values (utilization, memory, temperature, power, clocks) are compared with a
reading a moment apart, within the tolerances below (docs/development/real-gpu.md says
why each is what it is). Exit 0: every row agrees; 1: a row disagrees or is missing;
2: gpuenv or nvidia-smi could not be run.

nvidia-smi's fields are those `nvidia-smi --help-query-gpu` lists (index, name,
driver_version, compute_cap, utilization.gpu [%], memory.used/total [MiB],
temperature.gpu [C], power.draw [W], clocks.sm/mem [MHz]).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

FIELDS = [
    "index",
    "name",
    "driver_version",
    "compute_cap",
    "utilization.gpu",
    "memory.used",
    "memory.total",
    "temperature.gpu",
    "power.draw",
    "clocks.sm",
    "clocks.mem",
]


# GPU index ("*": every GPU) -> reading -> gpuenv's value
Readings = dict[str, dict[str, object]]


@dataclass(frozen=True)
class Tolerance:
    """How far apart two readings may be: exact text, or max(absolute, relative * smi)."""

    absolute: float = 0.0
    relative: float = 0.0
    exact: bool = False

    def allows(self, ours: object, smi: str) -> bool:
        if self.exact:
            try:  # 81920 MiB is 81920.0 MiB
                return float(str(ours)) == float(smi)
            except ValueError:
                return str(ours).strip() == smi.strip()
        try:
            a, b = float(str(ours)), float(smi)
        except ValueError:
            return False
        return abs(a - b) <= max(self.absolute, self.relative * abs(b))

    def describe(self) -> str:
        if self.exact:
            return "exact"
        parts = [f"±{self.absolute:g}"] if self.absolute else []
        parts += [f"±{self.relative:.0%}"] if self.relative else []
        return " or ".join(parts)


# reading -> (nvidia-smi field, unit, tolerance)
READINGS: dict[str, tuple[str, str, Tolerance]] = {
    "name": ("name", "", Tolerance(exact=True)),
    "driver": ("driver_version", "", Tolerance(exact=True)),
    "compute capability": ("compute_cap", "", Tolerance(exact=True)),
    "memory total": ("memory.total", "MiB", Tolerance(exact=True)),
    "utilization": ("utilization.gpu", "%", Tolerance(absolute=10)),
    "memory used": ("memory.used", "MiB", Tolerance(absolute=256, relative=0.02)),
    "temperature": ("temperature.gpu", "°C", Tolerance(absolute=3)),
    "power": ("power.draw", "W", Tolerance(absolute=15, relative=0.10)),
    "SM clock": ("clocks.sm", "MHz", Tolerance(absolute=50, relative=0.10)),
    "memory clock": ("clocks.mem", "MHz", Tolerance(relative=0.05)),
}


@dataclass
class Row:
    gpu: str
    reading: str
    source: str
    ours: object
    smi: str

    @property
    def ok(self) -> bool:
        return self.ours is not None and READINGS[self.reading][2].allows(self.ours, self.smi)


class CheckFailed(Exception):
    """gpuenv or nvidia-smi could not be run at all."""


def smi(binary: str) -> dict[str, dict[str, str]]:
    """nvidia-smi's reading now: GPU index -> field -> value."""
    done = subprocess.run(
        [binary, f"--query-gpu={','.join(FIELDS)}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode:
        raise CheckFailed(f"{binary} failed: {done.stderr.strip() or done.stdout.strip()}")
    out = {}
    for line in done.stdout.strip().splitlines():
        values = [v.strip() for v in line.split(",")]
        out[values[0]] = dict(zip(FIELDS, values, strict=True))
    return out


def gpuenv_json(gpuenv: str, *args: str) -> object:
    done = subprocess.run(
        [gpuenv, *args], capture_output=True, text=True, timeout=120, cwd=tempfile.gettempdir()
    )
    try:
        return json.loads(done.stdout)
    except ValueError:
        raise CheckFailed(
            f"gpuenv {' '.join(args)} printed no JSON: {done.stderr[-400:]}"
        ) from None


def compare(
    source: str, per_gpu: dict[str, dict[str, object]], reference: dict[str, dict[str, str]]
) -> list[Row]:
    """A row per reading the source gives, for every GPU nvidia-smi lists."""
    rows = []
    for index, fields in reference.items():
        ours = per_gpu.get(index, {})
        for reading, value in ours.items():
            rows.append(Row(index, reading, source, value, fields[READINGS[reading][0]]))
        if index not in per_gpu:
            rows.append(Row(index, "name", source, None, fields["name"]))
    return rows


def from_host(gpus: list[dict[str, object]], driver: object, keys: dict[str, str]) -> Readings:
    return {
        str(g["index"]): {
            **{reading: g.get(key) for reading, key in keys.items()},
            **({"driver": driver} if driver is not None else {}),
        }
        for g in gpus
    }


HOST_KEYS = {
    "name": "name",
    "compute capability": "compute_capability",
    "memory total": "memory_total_mib",
    "utilization": "utilization",
    "memory used": "memory_used_mib",
    "temperature": "temperature_c",
    "power": "power_w",
    "SM clock": "sm_clock_mhz",
    "memory clock": "memory_clock_mhz",
}
TOP_KEYS = {k: HOST_KEYS[k] for k in ("name", "memory total", "utilization", "memory used")}
TOP_KEYS |= {"temperature": "temperature_c", "power": "power_w"}


def resolve(gpuenv: str) -> tuple[Readings, str]:
    data = gpuenv_json(gpuenv, "resolve", "--framework", "pytorch", "--json")
    host = data.get("host") if isinstance(data, dict) else None
    if not isinstance(host, dict):
        raise CheckFailed(f"gpuenv resolve --json named no host: {str(data)[:300]}")
    return from_host(host.get("gpus") or [], host.get("driver"), HOST_KEYS), str(host.get("source"))


def top(gpuenv: str) -> Readings:
    data = gpuenv_json(gpuenv, "top", "--once", "--json")
    if not isinstance(data, dict):
        raise CheckFailed("gpuenv top --once --json printed no object")
    return from_host(data.get("gpus") or [], data.get("host", {}).get("driver"), TOP_KEYS)


def doctor(gpuenv: str) -> Readings:
    """The driver the doctor's 'NVIDIA driver' check names, as every GPU's driver."""
    checks = gpuenv_json(gpuenv, "doctor", "--json")
    if not isinstance(checks, list):
        raise CheckFailed("gpuenv doctor --json printed no list of checks")
    detail = next((c.get("detail") for c in checks if c.get("name") == "NVIDIA driver"), "")
    match = re.search(r"driver (\S+),", str(detail))
    return {"*": {"driver": match.group(1) if match else None}}


SAMPLE = re.compile(r"^(gpuenv_gpu_\w+)\{([^}]*)\} (\S+)$")
EXPORTED = {  # metric -> (reading, divide by)
    "gpuenv_gpu_utilization_ratio": ("utilization", 0.01),
    "gpuenv_gpu_memory_used_bytes": ("memory used", 2**20),
    "gpuenv_gpu_memory_total_bytes": ("memory total", 2**20),
    "gpuenv_gpu_temperature_celsius": ("temperature", 1),
    "gpuenv_gpu_power_watts": ("power", 1),
    "gpuenv_gpu_sm_clock_hertz": ("SM clock", 1e6),
    "gpuenv_gpu_memory_clock_hertz": ("memory clock", 1e6),
}


def exporter(gpuenv: str) -> Readings:
    """One scrape of `gpuenv exporter` on a free loopback port, stopped afterwards."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [gpuenv, "exporter", "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        text = _scrape(f"http://127.0.0.1:{port}/metrics", server)
    finally:
        server.terminate()
        server.wait(10)
    out: dict[str, dict[str, object]] = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if not match:
            continue
        name, labels, value = match.groups()
        tags = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        gpu = out.setdefault(tags.get("gpu", "?"), {})
        if name == "gpuenv_gpu_info":
            gpu.update(name=tags.get("name"), driver=tags.get("driver"))
        elif name in EXPORTED:
            reading, per = EXPORTED[name]
            gpu[reading] = round(float(value) / per, 2)
    return out


def _scrape(url: str, server: subprocess.Popen[str]) -> str:
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                return str(answer.read().decode())
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                said = server.stderr.read()[-400:] if server.stderr else ""
                raise CheckFailed(f"gpuenv exporter did not answer: {said}") from None
            time.sleep(0.2)


def check(gpuenv: str, nvidia_smi: str) -> tuple[list[Row], list[str]]:
    """Every row, and the notes (how gpuenv found the GPUs)."""
    rows: list[Row] = []
    notes = []
    steps: list[tuple[str, Callable[[], Readings]]] = [
        ("doctor --json", lambda: doctor(gpuenv)),
        ("top --once --json", lambda: top(gpuenv)),
        ("exporter", lambda: exporter(gpuenv)),
    ]
    per_gpu, source = resolve(gpuenv)
    rows += compare("resolve --json", per_gpu, smi(nvidia_smi))
    notes.append(f"gpuenv read the GPUs through: {source}")
    if source != "nvml":
        rows.append(Row("*", "name", "resolve --json (source)", source, "nvml"))
    for name, read in steps:
        per_gpu = read()
        reference = smi(nvidia_smi)
        if "*" in per_gpu:  # a host-wide reading: against every GPU's
            per_gpu = {index: per_gpu["*"] for index in reference}
        rows += compare(name, per_gpu, reference)
    return rows, notes


def table(rows: list[Row]) -> str:
    header = ("GPU", "reading", "gpuenv command", "gpuenv", "nvidia-smi", "tolerance", "")
    lines = [header]
    for row in rows:
        unit = READINGS[row.reading][1]
        ours = "missing" if row.ours is None else f"{row.ours}{' ' + unit if unit else ''}"
        smi_value = f"{row.smi}{' ' + unit if unit else ''}"
        verdict = "ok" if row.ok else "MISMATCH"
        tolerance = READINGS[row.reading][2].describe()
        lines.append((row.gpu, row.reading, row.source, ours, smi_value, tolerance, verdict))
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(str(cell).ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpuenv", required=True, help="the gpuenv command to check")
    parser.add_argument("--nvidia-smi", default=os.environ.get("NVIDIA_SMI", "nvidia-smi"))
    args = parser.parse_args(argv)
    try:
        rows, notes = check(args.gpuenv, args.nvidia_smi)
    except (CheckFailed, OSError, subprocess.TimeoutExpired) as exc:
        print(f"gpu-check: {exc}", file=sys.stderr)
        return 2
    print(table(rows))
    for note in notes:
        print(note)
    bad = [row for row in rows if not row.ok]
    print(
        f"{len(rows) - len(bad)} of {len(rows)} readings agree"
        + (f", {len(bad)} do not" if bad else "")
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
