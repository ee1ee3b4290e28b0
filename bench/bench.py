"""gpuenv's benchmark: medians of several runs, each gpuenv figure beside a baseline
measured in the same run (usually Docker itself doing the same work). Prints a table and
writes it to bench/results.md with the machine and date.

    make bench      (starts the test services, installs docker-compose if missing)

Targets: `gpuenv --version` imports neither docker nor rich; resolve over a synthetic
10,000-row matrix < 100 ms; a no-op `gpuenv build` ≤ 3× a fully cached `docker build`.
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
from dataclasses import dataclass
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


@dataclass
class Row:
    what: str
    value: float  # seconds
    baseline: str
    baseline_value: float
    target: str = ""

    def cells(self) -> list[str]:
        ratio = f"{self.value / self.baseline_value:.2f}×" if self.baseline_value else "-"
        return [
            self.what,
            _ms(self.value),
            self.baseline,
            _ms(self.baseline_value),
            ratio,
            self.target,
        ]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds >= 0.01 else f"{seconds * 1000:.1f} ms"


def median_seconds(action: Callable[[], object], runs: int = RUNS) -> float:
    action()  # warm caches (page cache, pyc) before measuring
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        action()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def command(*argv: str, cwd: Path | None = None) -> Callable[[], object]:
    def run() -> object:
        return subprocess.run(argv, check=True, capture_output=True, cwd=cwd)

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


def core_rows() -> tuple[list[Row], str]:
    from gpuenv.project.spec import default_spec
    from gpuenv.resolution.host import Gpu, Host
    from gpuenv.resolution.matrix import load_matrix
    from gpuenv.resolution.resolve import resolve

    rows = []
    baseline = median_seconds(command(sys.executable, "-c", "pass"))
    rows.append(
        Row(
            "gpuenv --version",
            median_seconds(command(GPUENV, "--version")),
            "python -c pass",
            baseline,
        )
    )
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
    rows.append(
        Row("gpuenv resolve --json (shipped matrix)", resolve_cli, "python -c pass", baseline)
    )
    probe = subprocess.run(
        [sys.executable, "-c", HEAVY_PROBE], capture_output=True, text=True, check=True
    )
    heavy = probe.stdout.rsplit("HEAVY=", 1)[1].strip()

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        synthetic_matrix(10_000, folder)
        matrix = load_matrix(str(folder))
        assert len(matrix.images_for("pytorch")) == 10_000
        host = Host(
            "575.51.03", (Gpu(0, "NVIDIA A100-SXM4-80GB"), Gpu(1, "NVIDIA H100 80GB HBM3")), "bench"
        )
        spec = default_spec(tmp, "pytorch").with_overrides(
            version=">=2.3", python="3.11", cuda=">=12.4"
        )
        # Every row is evaluated on each call (the explanation needs all of them).
        seconds = median_seconds(lambda: resolve(spec, matrix, host), runs=21)
    rows.append(Row("resolve(), synthetic 10,000-row matrix", seconds, "target", 0.1, "< 100 ms"))
    note = f"Heavy modules imported by `gpuenv --version`: {heavy or 'none (rich, docker, yaml, pynvml all absent)'}."
    return rows, note


def docker_rows() -> tuple[list[Row], str]:
    """No-op build: gpuenv against `docker build` and `docker-compose build` of the same
    rendered Dockerfile, all fully cached."""
    if not os.environ.get("DOCKER_HOST") or not os.environ.get("GPUENV_REGISTRY_MIRROR"):
        return (
            [],
            "Docker rows skipped: run through `make bench`, which starts the engine and registry.",
        )
    compose = shutil.which("docker-compose")
    with tempfile.TemporaryDirectory() as tmp:
        project, gpuenv = _bench_project(tmp, "benchproject", "# bench\n")
        tag = subprocess.run(
            [*gpuenv, "build", "-q"], check=True, capture_output=True, text=True
        ).stdout.strip()
        context = Path(tmp) / "context"
        _build_context(project, context)
        (context / "docker-compose.yml").write_text(
            "version: '3'\nservices:\n  train:\n    build: .\n    image: gpuenv-bench/compose:1\n"
        )
        docker_build = command("docker", "build", "-q", "-t", "gpuenv-bench/docker:1", str(context))
        rows = [
            Row(
                "gpuenv build (no-op)",
                median_seconds(command(*gpuenv, "build", "-q")),
                "docker build (cached)",
                median_seconds(docker_build),
                "≤ 3×",
            ),
        ]
        note = ""
        if compose:
            compose_build = command(compose, "build", "-q", cwd=context)
            rows.append(
                Row(
                    "gpuenv build (no-op)",
                    rows[0].value,
                    "docker-compose build (cached)",
                    median_seconds(compose_build),
                )
            )
        else:
            note = "docker-compose is not installed: its rows are missing (make bench installs it)."

        # Running a command: the same cached image, started, waited for and removed.
        (project / "gpuenv.yaml").write_text((project / "gpuenv.yaml").read_text() + "gpus: none\n")
        subprocess.run([*gpuenv, "lock"], check=True, capture_output=True)
        tag = subprocess.run(
            [*gpuenv, "build", "-q"], check=True, capture_output=True, text=True
        ).stdout.strip()
        gpuenv_run = median_seconds(command(*gpuenv, "run", "-q", "--", "true"))
        docker_run = median_seconds(command("docker", "run", "--rm", tag, "true"))
        rows.append(
            Row(
                "gpuenv run -- true", gpuenv_run, "docker run --rm IMAGE true", docker_run, "≤ 1.5×"
            )
        )
        # The same container as gpuenv makes it: init, project mount, shm, ulimits.
        same = command(
            "docker",
            "run",
            "--rm",
            "--init",
            "-v",
            f"{project}:/workspace",
            "-w",
            "/workspace",
            "--shm-size",
            "8g",
            "--ulimit",
            "stack=67108864",
            "--security-opt",
            "no-new-privileges",
            "-e",
            "CUDA_DEVICE_ORDER=PCI_BUS_ID",
            tag,
            "true",
        )
        rows.append(
            Row("gpuenv run -- true", gpuenv_run, "docker run, same options", median_seconds(same))
        )
        if compose:
            (context / "docker-compose.yml").write_text(
                f"version: '3'\nservices:\n  train:\n    image: {tag}\n"
            )
            compose_run = median_seconds(
                command(compose, "run", "--rm", "-T", "train", "true", cwd=context)
            )
            rows.append(
                Row("gpuenv run -- true", gpuenv_run, "docker-compose run --rm", compose_run)
            )
        subprocess.run(
            ["docker", "rmi", "-f", tag, "gpuenv-bench/docker:1", "gpuenv-bench/compose:1"],
            capture_output=True,
        )
    return rows, note


def _image_size(reference: str) -> int:
    out = subprocess.run(
        ["docker", "image", "inspect", "-f", "{{.Size}}", reference],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(out.stdout.strip())


def _bench_project(
    tmp: str, name: str, requirements: str, extra: str = ""
) -> tuple[Path, list[str]]:
    """A project locked for the stand-in 24.05 image and built once; its gpuenv command."""
    project = Path(tmp) / name
    project.mkdir()
    (project / "requirements.txt").write_text(requirements)
    (project / "gpuenv.yaml").write_text(
        f"name: {name}\nframework: pytorch\nversion: '2.4'\nrequirements: requirements.txt\n{extra}"
    )
    gpuenv = [GPUENV, "-C", str(project)]
    subprocess.run(
        [*gpuenv, "lock", "--driver", "550.54.15", "--gpu", "RTX 4090"],
        check=True,
        capture_output=True,
    )
    subprocess.run([*gpuenv, "build", "-q"], check=True, capture_output=True)
    return project, gpuenv


def _build_context(project: Path, folder: Path) -> None:
    """The exact context `gpuenv build` sends, unpacked for `docker build`."""
    import io
    import tarfile

    from gpuenv.images.service import load_project, plan

    folder.mkdir()
    planned = plan(load_project(str(project)), os.environ["GPUENV_REGISTRY_MIRROR"])
    with tarfile.open(fileobj=io.BytesIO(planned.context())) as archive:
        archive.extractall(folder, filter="data")


def rebuild_rows() -> tuple[list[Row], str]:
    """A requirements change: gpuenv rebuilds the layers after the base; docker build
    --no-cache of the same Dockerfile rebuilds all. And what the project layers add."""
    if not os.environ.get("DOCKER_HOST") or not os.environ.get("GPUENV_REGISTRY_MIRROR"):
        return [], ""
    runs = max(3, RUNS // 3)
    with tempfile.TemporaryDirectory() as tmp:
        # The stand-in bases carry a wheelhouse: containers here have no network.
        requirements = "--no-index\n--find-links /opt/wheelhouse\nnumpy\nsix\n"
        project, gpuenv = _bench_project(tmp, "benchrebuild", requirements, "gpus: none\n")
        tags = []
        gpuenv_times, docker_times = [], []

        for i in range(runs):
            (project / "requirements.txt").write_text(requirements + f"# change {i}\n")
            subprocess.run([*gpuenv, "lock"], check=True, capture_output=True)
            start = time.perf_counter()
            tag = subprocess.run(
                [*gpuenv, "build", "-q"], check=True, capture_output=True, text=True
            ).stdout.strip()
            gpuenv_times.append(time.perf_counter() - start)
            tags.append(tag)
            context = Path(tmp) / f"context{i}"
            _build_context(project, context)
            start = time.perf_counter()
            subprocess.run(
                [
                    "docker",
                    "build",
                    "--no-cache",
                    "-q",
                    "-t",
                    f"gpuenv-bench/fresh:{i}",
                    str(context),
                ],
                check=True,
                capture_output=True,
            )
            docker_times.append(time.perf_counter() - start)
        rows = [
            Row(
                "gpuenv build after a requirements change",
                statistics.median(gpuenv_times),
                "docker build --no-cache, same Dockerfile",
                statistics.median(docker_times),
                "same or better",
            ),
        ]
        base = f"{os.environ['GPUENV_REGISTRY_MIRROR']}/nvidia/pytorch:24.05-py3"
        added = _image_size(tags[-1]) - _image_size(base)
        installed = subprocess.run(
            [
                "docker",
                "run",
                "--rm",
                "--entrypoint",
                "sh",
                tags[-1],
                "-c",
                "du -sk /usr/local/lib/python3*/dist-packages/ | cut -f1",
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        installed_bytes = int(installed or 0) * 1024
        subprocess.run(
            ["docker", "rmi", "-f", *set(tags), *(f"gpuenv-bench/fresh:{i}" for i in range(runs))],
            capture_output=True,
        )
    extra = max(0, added - installed_bytes)
    note = (
        f"Image size: the project layers add {added / 1e6:.1f} MB on top of the base, for packages "
        f"(numpy, six, from the base's wheelhouse) that take {installed_bytes / 1e6:.1f} MB installed "
        f"(du): {extra / 1e6:.1f} MB beyond them, so no pip or apt cache is left in the layers. "
        f"Rebuild rows: medians of {runs}."
    )
    return rows, note


def main() -> None:
    rows, notes = [], []
    for section in (core_rows, docker_rows, rebuild_rows):
        section_rows, note = section()
        rows += section_rows
        if note:
            notes.append(note)
    header = (
        f"Machine: {platform.node()}, {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}; {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; "
        f"medians of {RUNS} runs (resolve: 21)."
    )
    lines = [
        "| measurement | gpuenv | baseline | baseline | ratio | target |",
        "| --- | --- | --- | --- | --- | --- |",
        *("| " + " | ".join(row.cells()) + " |" for row in rows),
    ]
    report = (
        f"# gpuenv benchmark\n\n{header}\n\n"
        + "\n".join(lines)
        + "\n\n"
        + "\n".join(f"- {n}" for n in notes)
        + "\n"
    )
    print(report)
    (REPO / "bench" / "results.md").write_text(report)


if __name__ == "__main__":
    main()
