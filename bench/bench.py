"""gpuenv's benchmark: prints a table of medians, with ratios against a baseline measured
in the same run, and writes it to bench/results.md.

    make bench            (or: .venv/bin/python bench/bench.py)

Targets (issue #2): `gpuenv --version` starts without importing docker or rich;
resolve over a synthetic 10,000-row matrix takes under 100 ms.
"""

from __future__ import annotations

import datetime
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
GPUENV = str(BIN / "gpuenv")
RUNS = int(os.environ.get("BENCH_RUNS", "15"))
HEAVY_PROBE = """
import sys
from gpuenv.cli import main
try:
    main(["--version"])
except SystemExit:
    pass
print("HEAVY=" + ",".join(m for m in ("rich", "docker", "yaml", "pynvml") if m in sys.modules))
"""


def median_seconds(action: Callable[[], object], runs: int = RUNS) -> float:
    action()  # warm caches (page cache, pyc) before measuring
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        action()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def command(*argv: str, env: dict[str, str] | None = None) -> Callable[[], object]:
    def run() -> object:
        return subprocess.run(argv, check=True, capture_output=True, env=env)

    return run


def synthetic_matrix(rows: int, folder: Path) -> None:
    """The real cuda/gpus data plus `rows` PyTorch images spread over real-looking values."""
    for name in ("cuda.yaml", "gpus.yaml"):
        shutil.copy(REPO / "matrices" / name, folder / name)
    cudas = ["11.8.0", "12.1.1", "12.2.2", "12.4.1", "12.6.3", "12.8.0", "12.9.1", "13.0.0"]
    drivers = ["520", "530", "535", "545", "560", "570.26", "575", "580"]
    lines = [
        "schema: 1",
        "kind: framework-images",
        "framework: pytorch",
        "family: ngc",
        "repository: example.invalid/pytorch",
        'updated: "2026-11-29"',
        "images:",
    ]
    for i in range(rows):
        k = i % len(cudas)
        year, month = 10 + i // 12 % 90, i % 12 + 1
        lines.append(
            f'  - {{tag: "t{i}", release: "{year:02d}.{month:02d}", '
            f'framework_version: "2.{i % 15}.0a0+{i:08x}", cuda: "{cudas[k]}", cudnn: null, '
            f'python: "3.{10 + i % 3}", ubuntu: "22.04", min_driver: "{drivers[k]}", '
            f'forward_compat: ["470.57", "535.86"], min_compute_capability: "7.5", '
            f"evidence: secondary, unverified: [], note: null}}"
        )
    (folder / "synthetic.yaml").write_text("\n".join(lines) + "\n")


def main() -> None:
    from gpuenv.host import Gpu, Host
    from gpuenv.matrix import load_matrix
    from gpuenv.resolve import resolve
    from gpuenv.spec import default_spec

    results: list[tuple[str, float, str, float]] = []
    baseline = median_seconds(command(sys.executable, "-c", "pass"))
    version = median_seconds(command(GPUENV, "--version"))
    results.append(("gpuenv --version", version, "python -c pass", baseline))
    resolve_cli = median_seconds(
        command(
            GPUENV,
            "resolve",
            "--framework",
            "pytorch",
            "--json",
            "--driver",
            "550.54.15",
            "--gpu",
            "RTX 4090",
        )
    )
    results.append(
        ("gpuenv resolve --json (shipped matrix)", resolve_cli, "python -c pass", baseline)
    )

    probe = subprocess.run(
        [sys.executable, "-c", HEAVY_PROBE], capture_output=True, text=True, check=True
    )
    heavy = probe.stdout.rsplit("HEAVY=", 1)[1].strip()

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        synthetic_matrix(10_000, folder)
        load = median_seconds(lambda: load_matrix(str(folder)), runs=3)
        matrix = load_matrix(str(folder))
        assert len(matrix.images_for("pytorch")) == 10_000
        host = Host(
            "575.51.03", (Gpu(0, "NVIDIA A100-SXM4-80GB"), Gpu(1, "NVIDIA H100 80GB HBM3")), "bench"
        )
        spec = default_spec(tmp, "pytorch").with_overrides(
            version=">=2.3", python="3.11", cuda=">=12.4"
        )
        # Every row is evaluated on each call (the explanation needs all of them).
        resolve_time = median_seconds(lambda: resolve(spec, matrix, host), runs=21)

    rows = [
        f"| {name} | {value * 1000:.1f} ms | {ref} | {ref_value * 1000:.1f} ms | {value / ref_value:.2f}× |"
        for name, value, ref, ref_value in results
    ]
    table = "\n".join(
        [
            "| measurement | median | baseline | baseline median | ratio |",
            "| --- | --- | --- | --- | --- |",
            *rows,
            f"| resolve(), synthetic 10,000-row matrix (target < 100 ms) | {resolve_time * 1000:.1f} ms "
            f"| target 100 ms | 100.0 ms | {resolve_time / 0.1:.2f}× |",
            f"| load_matrix(), synthetic 10,000-row matrix (YAML parse + validation) | "
            f"{load * 1000:.0f} ms | - | - | - |",
        ]
    )
    heavy_line = f"Heavy modules imported by `gpuenv --version`: {heavy or 'none (rich, docker, yaml, pynvml all absent)'}"
    header = (
        f"Machine: {platform.node()}, {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}; {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; "
        f"median of {RUNS} runs (resolve: 21)."
    )
    report = f"# gpuenv benchmark\n\n{header}\n\n{table}\n\n{heavy_line}\n"
    print(report)
    (REPO / "bench" / "results.md").write_text(report)


if __name__ == "__main__":
    main()
