"""gpuenv's benchmark: medians of several runs, each gpuenv figure beside a baseline
measured in the same run (usually Docker itself doing the same work). Prints a table and
writes it to bench/results.md with the machine and date.

    make bench      (starts the test services, installs docker-compose if missing)

Speed guards (issue 32: the design's floor is the SDK gpuenv is built on, not the docker
CLI; a guard that passes is left alone, and no mechanism is added to meet one):
`gpuenv run -- true` ≤ 1.5× a docker-py program doing the same on the same engine
(create with the same options, start, wait, remove), with its ratio to `docker run`
reported beside it; `gpuenv --version` ≤ 1.6× `python -c "import click"`; `gpuenv
resolve --json` on a described host ≤ 2.5× `python -c "import click, yaml,
packaging.specifiers"`; a no-op `gpuenv build` ≤ 4× a fully cached classic `docker
build`. Also: resolve over a synthetic 10,000-row matrix < 100 ms. Each row with a
target says whether it is met.

    python bench/bench.py [--output FILE]    (the rows that need no engine, without it)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import pwd
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
GPUENV = str(BIN / "gpuenv")
RUNS = int(os.environ.get("BENCH_RUNS", "15"))
TARGET_RUNS = int(os.environ.get("BENCH_TARGET_RUNS", "25"))  # the rows with a guard
HEAVY_PROBE = """
import sys
from gpuenv.cli.tree import main
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
    limit: float | None = None  # the highest ratio that meets the target
    spread: str = ""  # the samples' quartiles, for the rows timed in turns
    holds: bool | None = None  # a target that is not a ratio: whether it held
    unit: str = "s"  # what value and baseline_value are: seconds, or MiB of memory

    @property
    def ratio(self) -> float | None:
        return self.value / self.baseline_value if self.baseline_value else None

    @property
    def met(self) -> bool | None:
        if self.holds is not None:
            return self.holds
        if self.limit is None or self.ratio is None:
            return None
        return self.ratio <= self.limit

    def cells(self) -> list[str]:
        """The table's cells; the met column is empty for rows without a target.

        >>> Row("a", 0.15, "b", 0.1, "≤ 1.5×", 1.5).cells()
        ['a', '150 ms', 'b', '100 ms', '1.50×', '≤ 1.5×', 'yes']
        >>> Row("a", 0.2, "b", 0.1, "≤ 1.5×", 1.5).cells()[-2:]
        ['≤ 1.5×', 'no']
        >>> Row("a", 0.005, "b", 0.01).cells()
        ['a', '5.0 ms', 'b', '10 ms', '0.50×', '', '']
        """
        met = {True: "yes", False: "no", None: ""}[self.met]
        ratio = f"{self.ratio:.2f}×" if self.ratio is not None else "-"
        shown = _ms if self.unit == "s" else (lambda v: f"{v:.0f} {self.unit}")
        return [
            self.what,
            shown(self.value),
            self.baseline,
            shown(self.baseline_value),
            ratio,
            self.target,
            met,
        ]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds >= 0.01 else f"{seconds * 1000:.1f} ms"


def median_seconds(
    action: Callable[[], object],
    runs: int = RUNS,
    setup: Callable[[], object] | None = None,
) -> float:
    """The median time of `action`; `setup` runs before each sample, untimed."""
    action()  # warm caches (page cache, pyc, gpuenv's matrix cache) before measuring
    samples = []
    for _ in range(runs):
        if setup is not None:
            setup()
        start = time.perf_counter()
        action()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def paired_samples(
    action: Callable[[], object], baseline: Callable[[], object], runs: int = RUNS
) -> tuple[list[float], list[float]]:
    """Samples of `action` and `baseline`, taken in turns (ABAB) so that a machine that
    slows down or speeds up during the run (other work on it) moves both alike."""
    action()
    baseline()
    ours: list[float] = []
    theirs: list[float] = []
    for _ in range(runs):
        for measure, samples in ((action, ours), (baseline, theirs)):
            start = time.perf_counter()
            measure()
            samples.append(time.perf_counter() - start)
    return ours, theirs


def paired_medians(
    action: Callable[[], object], baseline: Callable[[], object], runs: int = RUNS
) -> tuple[float, float]:
    """The medians of `paired_samples`."""
    ours, theirs = paired_samples(action, baseline, runs)
    return statistics.median(ours), statistics.median(theirs)


def spread(ours: list[float], theirs: list[float]) -> str:
    """The quartiles of both sides and of the per-turn ratio.

    >>> spread([0.1, 0.2, 0.3, 0.4], [0.1, 0.1, 0.2, 0.2])
    'gpuenv 125–375 ms, baseline 100–200 ms, ratio per turn 1.12–2.00×'
    """

    def quartiles(values: list[float]) -> tuple[float, float]:
        q = statistics.quantiles(values, n=4)
        return q[0], q[2]

    (a, b), (c, d) = quartiles(ours), quartiles(theirs)
    r1, r2 = quartiles([x / y for x, y in zip(ours, theirs, strict=True)])
    return (
        f"gpuenv {a * 1000:.0f}–{b * 1000:.0f} ms, baseline {c * 1000:.0f}–{d * 1000:.0f} ms, "
        f"ratio per turn {r1:.2f}–{r2:.2f}×"
    )


def paired_row(
    what: str,
    action: Callable[[], object],
    baseline_name: str,
    baseline: Callable[[], object],
    target: str = "",
    limit: float | None = None,
    runs: int = RUNS,
) -> Row:
    """A row timed in turns with its baseline, with the spread of both."""
    ours, theirs = paired_samples(action, baseline, runs)
    return Row(
        what,
        statistics.median(ours),
        baseline_name,
        statistics.median(theirs),
        target,
        limit,
        spread(ours, theirs),
    )


def command(
    *argv: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> Callable[[], object]:
    def run() -> object:
        return subprocess.run(argv, check=True, capture_output=True, cwd=cwd, env=env)

    return run


def describe_host(path: Path, gpus: int = 4) -> Path:
    """A GPUENV_HOST_FILE: `gpus` A100s, idle, with the UUIDs NVML would report."""
    path.write_text(
        json.dumps(
            {
                "driver": "550.54.15",
                "gpus": [
                    {
                        "index": i,
                        "name": "NVIDIA A100-SXM4-80GB",
                        "uuid": gpu_uuid(i),
                        "memory_total_mib": 81920,
                        "memory_used_mib": 0,
                        "utilization": 0,
                        "processes": [],
                    }
                    for i in range(gpus)
                ],
            }
        )
    )
    return path


def gpu_uuid(index: int) -> str:
    """
    >>> gpu_uuid(2)
    'GPU-22222222-1111-4000-8000-000000000002'
    """
    return f"GPU-{str(index) * 8}-1111-4000-8000-{index:012d}"


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


def synthetic_resolution(size: int, folder: Path) -> Callable[[], object]:
    """resolve() of a PyTorch spec on a two-GPU host, against a synthetic matrix of
    `size` rows written into `folder`."""
    from gpuenv.common.versions import DriverVersion
    from gpuenv.host.machine import Gpu, Host
    from gpuenv.matrix.load import load_matrix
    from gpuenv.project.spec import default_spec
    from gpuenv.resolution.resolve import resolve

    synthetic_matrix(size, folder)
    matrix = load_matrix(str(folder))
    assert len(matrix.images_for("pytorch")) == size
    gpus = (Gpu(0, "NVIDIA A100-SXM4-80GB"), Gpu(1, "NVIDIA H100 80GB HBM3"))
    host = Host(DriverVersion.parse("575.51.03"), gpus, "bench")
    spec = default_spec(str(folder), "pytorch").with_overrides(
        version=">=2.3", python="3.11", cuda=">=12.4"
    )
    return lambda: resolve(spec, matrix, host)


def core_rows() -> tuple[list[Row], str]:
    rows = [
        paired_row(
            "gpuenv --version",
            command(GPUENV, "--version"),
            'python -c "import click"',
            command(sys.executable, "-c", "import click"),
            "≤ 1.6×",
            1.6,
            runs=TARGET_RUNS,
        )
    ]
    baseline = median_seconds(command(sys.executable, "-c", "pass"))
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
    rows += resolve_rows()
    probe = subprocess.run(
        [sys.executable, "-c", HEAVY_PROBE], capture_output=True, text=True, check=True
    )
    heavy = probe.stdout.rsplit("HEAVY=", 1)[1].strip()

    with tempfile.TemporaryDirectory() as tmp:
        resolution = synthetic_resolution(10_000, Path(tmp))
        # Every row is evaluated on each call (the explanation needs all of them).
        seconds = median_seconds(resolution, runs=21)
    rows.append(
        Row("resolve(), synthetic 10,000-row matrix", seconds, "target", 0.1, "< 100 ms", 1.0)
    )
    note = f"Heavy modules imported by `gpuenv --version`: {heavy or 'none (rich, docker, yaml, pynvml all absent)'}."
    return rows, note


RESOLVE_DESCRIBED = (
    "resolve",
    "--framework",
    "pytorch",
    "--json",
    "--driver",
    "550.54",
    "--gpu",
    "H100 80GB HBM3",
)


def resolve_rows() -> list[Row]:
    """resolve --json on a described host against Python importing the libraries it
    needs; with the user's matrix cache (warm after the first run), then with none."""
    baseline = 'python -c "import click, yaml, packaging.specifiers"'
    described = paired_row(
        "gpuenv resolve --json, described host",
        command(GPUENV, *RESOLVE_DESCRIBED),
        baseline,
        command(sys.executable, "-c", "import click, yaml, packaging.specifiers"),
        "≤ 2.5×",
        2.5,
        runs=TARGET_RUNS,
    )
    with tempfile.TemporaryDirectory() as tmp:
        cold_dir = Path(tmp) / "cache"
        cold = median_seconds(
            command(
                GPUENV, *RESOLVE_DESCRIBED, env={**os.environ, "GPUENV_CACHE_DIR": str(cold_dir)}
            ),
            setup=lambda: shutil.rmtree(cold_dir, ignore_errors=True),
        )
    return [
        described,
        Row(
            "gpuenv resolve --json, matrix cache emptied each run",
            cold,
            baseline,
            described.baseline_value,
        ),
    ]


SDK_RUN = """
import sys
import docker

api = docker.APIClient(base_url=sys.argv[1], version="auto")
host = api.create_host_config(
    init=True,
    binds={sys.argv[3]: {"bind": "/workspace", "mode": "rw"}},
    shm_size="8g",
    ulimits=[docker.types.Ulimit(name="stack", soft=67108864, hard=67108864)],
    security_opt=["no-new-privileges"],
)
container = api.create_container(
    sys.argv[2], ["true"], working_dir="/workspace",
    environment={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, host_config=host,
)
api.start(container)
code = api.wait(container)["StatusCode"]
api.remove_container(container, force=True)
sys.exit(code)
"""


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
        # The classic builder's Dockerfile (no cache mounts): the docker CLI here has no
        # buildx, so `docker build` (and docker-compose) build with the classic builder.
        context = Path(tmp) / "context"
        _build_context(project, context, builder="classic")
        (context / "docker-compose.yml").write_text(
            "version: '3'\nservices:\n  train:\n    build: .\n    image: gpuenv-bench/compose:1\n"
        )
        docker_build = command("docker", "build", "-q", "-t", "gpuenv-bench/docker:1", str(context))
        rows = [
            paired_row(
                "gpuenv build (no-op)",
                command(*gpuenv, "build", "-q"),
                "docker build (cached, classic builder)",
                docker_build,
                "≤ 4×",
                4.0,
                runs=TARGET_RUNS,
            )
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
        # The floor: a docker-py program that makes the container gpuenv makes (init, the
        # project mount, shm, ulimits, no new privileges), starts it, waits and removes it.
        rows.append(
            paired_row(
                "gpuenv run -- true",
                command(*gpuenv, "run", "-q", "--", "true"),
                "docker-py program, same container (create, start, wait, remove)",
                command(
                    sys.executable, "-c", SDK_RUN, os.environ["DOCKER_HOST"], tag, str(project)
                ),
                "≤ 1.5×",
                1.5,
                runs=TARGET_RUNS,
            )
        )
        gpuenv_run = rows[-1].value
        rows.append(
            Row(
                "gpuenv run -- true",
                gpuenv_run,
                "docker run --rm IMAGE true",
                median_seconds(command("docker", "run", "--rm", tag, "true")),
            )
        )
        if compose:
            (context / "docker-compose.yml").write_text(
                f"version: '3'\nservices:\n  train:\n    image: {tag}\n"
            )
            try:
                compose_run = median_seconds(
                    command(compose, "run", "--rm", "-T", "train", "true", cwd=context)
                )
            except subprocess.CalledProcessError as exc:  # a peer's baseline, not gpuenv
                stderr = (exc.stderr or b"").decode(errors="replace").splitlines()
                note = f"docker-compose run failed ({(stderr or ['?'])[-1][:120]}): its row is missing."
            else:
                rows.append(
                    Row("gpuenv run -- true", gpuenv_run, "docker-compose run --rm", compose_run)
                )
        subprocess.run(
            ["docker", "rmi", "-f", tag, "gpuenv-bench/docker:1", "gpuenv-bench/compose:1"],
            capture_output=True,
        )
    return rows, note


def user_run_rows() -> tuple[list[Row], str]:
    """`gpuenv run --gpus 1` as a user who is not root, on a described 4-GPU host with GPU
    claims (a state folder of its own), against `docker run` of the same image as that
    user: gpuenv's whole run path (claims, preflight, identity) beside Docker's."""
    if not os.environ.get("DOCKER_HOST") or not os.environ.get("GPUENV_REGISTRY_MIRROR"):
        return [], ""
    name = os.environ.get("GPUENV_TEST_USER", "gpuenv-tester")
    if os.getuid() != 0:
        return [], f"The non-root run row is skipped: it needs root, to run as {name}."
    try:
        user = pwd.getpwnam(name)
    except KeyError:
        return [], f"The non-root run row is skipped: no user {name} (scripts/services.sh)."
    tmp = tempfile.mkdtemp(prefix="gpuenv-bench-")
    tag = ""
    try:
        os.chmod(tmp, 0o755)
        host_file = describe_host(Path(tmp) / "host.json")
        # The state folder as an admin makes it on a shared server (docs: monitoring), so
        # the runs keep their usage records, as they would there.
        state = Path(tmp) / "state"
        for folder in (state, state / "usage"):
            folder.mkdir()
            folder.chmod(0o1777)
        project, gpuenv = _bench_project(tmp, "benchclaims", "# bench\n", "gpus: 1\n")
        tag = subprocess.run(
            [*gpuenv, "build", "-q"], check=True, capture_output=True, text=True
        ).stdout.strip()
        for root, _, files in os.walk(project):  # the user's own project
            for path in [root, *(os.path.join(root, f) for f in files)]:
                os.chown(path, user.pw_uid, user.pw_gid)
        found = _gpuenv_for(user, Path(tmp) / "installed")
        if isinstance(found, str):
            return [], f"The non-root run row is skipped: {found}."
        python, pythonpath = found
        env = {
            "PATH": os.environ["PATH"],
            "HOME": user.pw_dir,
            "USER": name,
            "LOGNAME": name,
            "DOCKER_HOST": os.environ["DOCKER_HOST"],
            "GPUENV_REGISTRY_MIRROR": os.environ["GPUENV_REGISTRY_MIRROR"],
            "GPUENV_HOST_FILE": str(host_file),
            "GPUENV_STATE_DIR": str(state),
            "PYTHONPATH": pythonpath,
        }
        as_user = _as_user(user)
        # The command as the wheel installs it: pip's console script for gpuenv.cli:entry.
        script = _console_script(Path(tmp) / "installed", python)
        gpuenv_user = [*as_user, str(script), "-C", str(project)]
        # The claims path, not a fallback: one of the described GPUs, as the user. In the
        # project folder, as a user would be (and not the checkout, whose gpuenv would
        # come first on sys.path).
        probe = "echo $NVIDIA_VISIBLE_DEVICES; id -u"
        seen = subprocess.run(
            [*gpuenv_user, "run", "--gpus", "1", "--", "sh", "-c", probe],
            check=True,
            capture_output=True,
            text=True,
            cwd=project,
            env=env,
        ).stdout.split()
        assert seen[0] in {gpu_uuid(i) for i in range(4)} and seen[1] == str(user.pw_uid), seen
        ids = f"{user.pw_uid}:{user.pw_gid}"
        docker = ["docker", "run", "--rm", "--gpus", "device=0", "--user", ids, tag, "true"]
        # The first run (the probe above) made the user's account image: the runs
        # timed here upload nothing into their containers.
        account = f"{tag}-u{user.pw_uid}"
        made = subprocess.run(["docker", "image", "inspect", account], capture_output=True)
        row = paired_row(
            f"gpuenv run --gpus 1 -- true, as {name}, claims, 4 described GPUs",
            command(*gpuenv_user, "run", "--gpus", "1", "--", "true", cwd=project, env=env),
            f"docker run --rm --gpus device=0 --user {ids} IMAGE true, as {name}",
            command(*as_user, *docker, cwd=project, env=env),
            runs=TARGET_RUNS,
        )
    finally:
        if tag:
            subprocess.run(
                ["docker", "rmi", "-f", f"{tag}-u{user.pw_uid}", tag], capture_output=True
            )
        shutil.rmtree(tmp, ignore_errors=True)
    note = (
        "The non-root run row runs gpuenv laid out as the wheel installs it (the package, "
        f"its console script), with {python}, on a state folder made as an admin makes it "
        "(claims and usage records kept); "
        + (
            f"its runs use {name}'s account image ({account}), made by its first run."
            if made.returncode == 0
            else f"no account image was made for {name}: its runs upload the passwd entry."
        )
    )
    return [row], note


def _as_user(user: pwd.struct_passwd) -> list[str]:
    return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups"]


def _console_script(folder: Path, python: str) -> Path:
    """`gpuenv` as pip (24+) writes the console script `gpuenv = gpuenv.cli:entry`."""
    script = folder / "bin" / "gpuenv"
    script.parent.mkdir(exist_ok=True)
    script.write_text(
        f"#!{python}\n"
        "import sys\n"
        "from gpuenv.cli import entry\n"
        "if __name__ == '__main__':\n"
        "    sys.argv[0] = sys.argv[0].removesuffix('.exe')\n"
        "    sys.exit(entry())\n"
    )
    script.chmod(0o755)
    script.parent.chmod(0o755)
    return script


def _gpuenv_for(user: pwd.struct_passwd, folder: Path) -> tuple[str, str] | str:
    """gpuenv as `user` can run it: a copy laid out as the wheel (the package, with the
    matrices and images in _data) in a folder every user can read, and the first Python
    the user can run it with: GPUENV_TEST_USER_PYTHON (with gpuenv's dependencies), this
    one, or the distribution's of the same version with this one's packages. The
    interpreter and PYTHONPATH, or why there is none."""
    site = folder / "site"
    shutil.copytree(REPO / "gpuenv", site / "gpuenv", ignore=shutil.ignore_patterns("__pycache__"))
    for data in ("matrices", "images"):
        shutil.copytree(REPO / data, site / "gpuenv" / "_data" / data)
    for root, dirs, files in os.walk(folder):
        for entry in dirs + files:
            path = os.path.join(root, entry)
            os.chmod(path, os.stat(path).st_mode | 0o444 | (0o111 if entry in dirs else 0))
    folder.chmod(0o755)
    packages = sysconfig.get_paths()["purelib"]
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [
        (os.environ.get("GPUENV_TEST_USER_PYTHON", ""), str(site)),
        (sys.executable, str(site)),
        (f"/usr/bin/{version}", f"{site}{os.pathsep}{packages}"),
    ]
    probe = "import click, docker, rich, yaml, gpuenv.cli; print(gpuenv.cli.__file__)"
    for python, path in candidates:
        if not python or not os.path.exists(python):
            continue
        found = subprocess.run(
            [*_as_user(user), python, "-c", probe],
            capture_output=True,
            text=True,
            cwd=folder,  # not the checkout: its gpuenv would shadow the copy
            env={"PATH": os.environ["PATH"], "HOME": user.pw_dir, "PYTHONPATH": path},
        )
        if found.returncode == 0 and found.stdout.strip().startswith(str(site)):
            subprocess.run(
                [python, "-m", "compileall", "-q", str(site)], check=True, capture_output=True
            )
            return python, path
    tried = ", ".join(python for python, _ in candidates if python)
    return f"{user.pw_name} can run gpuenv with none of {tried}"


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
    """A project locked for the stand-in 24.06 image and built once; its gpuenv command."""
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


def _uv_compile(project: Path, tmp: str) -> Callable[[], object]:
    """`uv pip compile` of the project's requirements for the image's Python, with the
    uv builds install (from the test index, once)."""
    uv = Path(tmp) / "uv" / "bin" / "uv"
    if not uv.exists():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--target",
                str(uv.parent.parent),
                "--index-url",
                os.environ["GPUENV_TEST_INDEX"],
                "uv==0.13.9",
            ],
            check=True,
            capture_output=True,
        )
    command = [
        str(uv),
        "pip",
        "compile",
        "-q",
        "--python-version",
        "3.11",
        "--generate-hashes",
        "-o",
        os.devnull,
        str(project / "requirements.txt"),
    ]
    return lambda: subprocess.run(command, check=True, capture_output=True)


def _build_context(
    project: Path, folder: Path, builder: Literal["buildkit", "classic"] = "buildkit"
) -> None:
    """The exact context `gpuenv build` sends (to `builder`), unpacked."""
    import io
    import tarfile

    from gpuenv.images.service import plan
    from gpuenv.lock.project import load_project

    folder.mkdir()
    planned = plan(
        load_project(str(project)), os.environ["GPUENV_REGISTRY_MIRROR"], builder=builder
    )
    with tarfile.open(fileobj=io.BytesIO(b"".join(planned.context()))) as archive:
        archive.extractall(folder, filter="data")


def engine_build(context: Path, tag: str, *, nocache: bool = False) -> None:
    """A BuildKit build of `context` through the Engine API (`POST /build?version=2`, as
    `docker buildx build` asks; the docker CLI here has no buildx), on the host network of
    the engine's namespace, where the test index answers."""
    query = f"version=2&networkmode=host&t={tag}" + ("&nocache=1" if nocache else "")
    archive = subprocess.run(
        ["tar", "-C", str(context), "-c", "."], check=True, capture_output=True
    ).stdout
    answer = subprocess.run(
        [
            "curl",
            "-sS",
            "--fail-with-body",
            "--unix-socket",
            os.environ["DOCKER_HOST"].removeprefix("unix://"),
            "-X",
            "POST",
            "-H",
            "Content-Type: application/x-tar",
            "--data-binary",
            "@-",
            f"http://docker/v1.41/build?{query}",
        ],
        input=archive,
        check=True,
        capture_output=True,
    ).stdout
    if b'"moby.image.id"' not in answer:
        raise subprocess.CalledProcessError(1, ["engine build", tag], stderr=answer[-300:])


def prune_build_cache() -> None:
    """Every BuildKit cache record of the engine (layers and cache mounts): cold."""
    subprocess.run(
        [
            "curl",
            "-sS",
            "--fail",
            "--unix-socket",
            os.environ["DOCKER_HOST"].removeprefix("unix://"),
            "-X",
            "POST",
            "http://docker/v1.41/build/prune?all=1",
        ],
        check=True,
        capture_output=True,
    )


# A training project's requirements, from the test index (scripts/services/pypi.sh): 16
# packages, 43 with their dependencies; scipy, numpy, pandas, matplotlib, scikit-learn,
# grpcio, pillow, tensorboard, fonttools over 5 MB each. `--trusted-host`: pip caches what a plain-http
# index serves only for a trusted host (an https index always).
TRAINING = """--index-url {index}
--trusted-host 127.0.0.1
numpy
pandas
scipy
scikit-learn
matplotlib
pillow
requests
tqdm
pyyaml
rich
einops
safetensors
sentencepiece
tensorboard
protobuf
tabulate
"""
BY_HAND = (
    "FROM {base}\n"
    "COPY requirements.txt /tmp/requirements.txt\n"
    # The stand-in's Debian Python is marked externally managed (NGC's Ubuntu one is not).
    "RUN pip install --break-system-packages -r /tmp/requirements.txt\n"
    "COPY . /workspace/\n"
)


class Samples(dict[str, list[float]]):
    """Seconds by what was timed."""

    def time(self, key: str, action: Callable[[], object]) -> object:
        start = time.perf_counter()
        result = action()
        self.setdefault(key, []).append(time.perf_counter() - start)
        return result

    def median(self, key: str) -> float:
        return statistics.median(self[key])


def _gpuenv_build(gpuenv: list[str], *flags: str) -> Callable[[], str]:
    def build() -> str:
        done = subprocess.run(
            [*gpuenv, "build", *flags], check=True, capture_output=True, text=True
        )
        return done.stdout.strip() + "\n" + done.stderr

    return build


def dependency_rows() -> tuple[list[Row], str]:
    """Builds users wait for, against the Dockerfile a user writes by hand (BY_HAND), all
    built by BuildKit on the same engine, one after the other in each run: the first
    build with cold caches, the rebuild after adding one requirement (uv, the default,
    and `installer: pip`), and a baked project's rebuild after a source edit. Each run's
    requirements carry a marker of their own (an environment marker that always holds),
    so no layer of an earlier run answers, and gpuenv's images of earlier runs are removed
    first (its tag is the locked set, not the text). A build after an edit locks the
    Python packages itself, so its time includes the re-lock."""
    index = os.environ.get("GPUENV_TEST_INDEX")
    if (
        not os.environ.get("DOCKER_HOST")
        or not os.environ.get("GPUENV_REGISTRY_MIRROR")
        or not index
    ):
        return [], ""
    runs = max(3, RUNS // 5)
    base = f"{os.environ['GPUENV_REGISTRY_MIRROR']}/nvidia/pytorch:24.06-py3"
    samples = Samples()
    ran: list[str] = []  # the baked rebuilds' dependency steps that were not cached
    tags: set[str] = set()
    with tempfile.TemporaryDirectory() as tmp:
        uv_project, uv = _bench_project(tmp, "benchdeps", "# bench\n", "gpus: none\n")
        pip_project, pip = _bench_project(
            tmp, "benchdepspip", "# bench\n", "gpus: none\ninstaller: pip\n"
        )
        (uv_project / "src").mkdir()
        (uv_project / "src" / "train.py").write_text("print('training')\n")
        by_hand = Path(tmp) / "by-hand"
        by_hand.mkdir()
        (by_hand / "Dockerfile").write_text(BY_HAND.format(base=base))
        (by_hand / "train.py").write_text("print('training')\n")
        folders = (uv_project, pip_project, by_hand)

        def write(requirements: str) -> None:
            """The requirements, not locked: each timed build locks its Python packages
            itself (in the base image), as a user's build after an edit does."""
            for folder in folders:
                (folder / "requirements.txt").write_text(requirements)

        def by_hand_build(tag: str) -> Callable[[], None]:
            tags.add(tag)
            return lambda: engine_build(by_hand, tag)

        try:
            for i in range(runs):
                marker = f'; platform_release != "bench-{os.getpid()}-{time.time_ns()}"'
                listed = TRAINING.format(index=index).replace("\ntqdm\n", f"\ntqdm{marker}\n")
                # Each way is timed from cold caches, then after adding one requirement
                # with the caches its first build left (a prune clears every cache mount).
                for name, build in (
                    ("by hand", by_hand_build),
                    ("uv", lambda tag: _gpuenv_build(uv, "-q")),
                    ("pip", lambda tag: _gpuenv_build(pip, "-q")),
                ):
                    write(listed)
                    # Cold: no image of an earlier run (a tag is the locked set, the same
                    # in every run), no cache of any kind on the engine.
                    made_before = [tag for tag in tags if tag.startswith("gpuenv/")]
                    if made_before:
                        subprocess.run(["docker", "rmi", "-f", *made_before], capture_output=True)
                    prune_build_cache()
                    for key, tag, requirements in (
                        (f"first {name}", f"gpuenv-bench/by-hand:{i}", listed),
                        (f"added {name}", f"gpuenv-bench/by-hand:{i}b", listed + "humanize\n"),
                    ):
                        write(requirements)
                        made = samples.time(key, build(tag))
                        if isinstance(made, str):  # gpuenv's output: the tag first
                            tags.add(made.split()[0])
                # A baked project, and the by-hand one, built; a source file edited; both
                # built again.
                tags.add(_gpuenv_build(uv, "--bake", "-q")().split()[0])
                by_hand_build(f"gpuenv-bench/by-hand:{i}c")()
                for folder in (uv_project / "src", by_hand):
                    (folder / "train.py").write_text(f"print('training', {i})\n")
                said = str(samples.time("edited uv", _gpuenv_build(uv, "--bake")))
                tags.add(said.split()[0])
                ran += [  # the install step's line, unless the builder reused it
                    line
                    for line in said.splitlines()
                    if line.startswith("[")
                    and "pip-install.sh" in line
                    and not line.endswith("· cached")
                ]
                samples.time("edited by hand", by_hand_build(f"gpuenv-bench/by-hand:{i}d"))
                # `gpuenv lock` after adding one requirement, against uv resolving the same
                # requirements on the host (its cache warm, as a user's is).
                write(listed)
                subprocess.run([*uv, "lock"], check=True, capture_output=True)
                write(listed + "attrs\n")
                samples.time("relock", lambda: subprocess.run([*uv, "lock"], check=True))
                samples.time("uv compile", _uv_compile(uv_project, tmp))
            sizes = [_image_size(tag) for tag in (f"gpuenv-bench/by-hand:{runs - 1}b",)]
            uv_tag = _gpuenv_build(uv, "-q")().split()[0]
            sizes.insert(0, _image_size(uv_tag))
        finally:
            subprocess.run(["docker", "rmi", "-f", *tags], capture_output=True)
    by_hand_first, by_hand_added = samples.median("first by hand"), samples.median("added by hand")
    rows = [
        Row(
            "gpuenv build, first, cold caches",
            samples.median("first uv"),
            "by-hand Dockerfile, BuildKit, cold",
            by_hand_first,
            "≤ 0.7×",
            0.7,
        ),
        Row(
            "  the same, installer: pip",
            samples.median("first pip"),
            "by-hand Dockerfile, BuildKit, cold",
            by_hand_first,
        ),
        Row(
            "gpuenv build after adding one requirement",
            samples.median("added uv"),
            "by-hand Dockerfile, BuildKit, cached",
            by_hand_added,
            "≤ 0.2×",
            0.2,
        ),
        Row(
            "  the same, installer: pip",
            samples.median("added pip"),
            "by-hand Dockerfile, BuildKit, cached",
            by_hand_added,
        ),
        Row(
            "gpuenv lock after adding one requirement",
            samples.median("relock"),
            "uv pip compile of the same requirements, on the host",
            samples.median("uv compile"),
        ),
        Row(
            "gpuenv build --bake after a source edit",
            samples.median("edited uv"),
            "by-hand Dockerfile after the same edit",
            samples.median("edited by hand"),
            "no dependency step runs",
            holds=not ran,
        ),
    ]
    said = (
        f"the dependency step ran in {len(ran)} of {runs} baked rebuilds ({ran[0][:100]})"
        if ran
        else f"no dependency step ran in any of the {runs} baked rebuilds (the step was cached)"
    )
    note = (
        f"Dependency builds: a training project of 16 requirements (43 packages, 9 over 5 MB, "
        f"from the test index on loopback), medians of {runs}; the one requirement added is "
        f"humanize. Image sizes after it: gpuenv {sizes[0] / 1e6:.0f} MB, by hand "
        f"{sizes[1] / 1e6:.0f} MB (pip's cache is in its layer). Baked rebuild after a source "
        f"edit: {said}."
    )
    return rows, note


def _peak_rss_mib(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Run `argv` to its end: its peak resident memory in MiB (the kernel's ru_maxrss of
    that child alone, from wait4) and its seconds."""
    with tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        child = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode:
            err.seek(0)
            raise subprocess.CalledProcessError(child.returncode, argv, stderr=err.read())
    return usage.ru_maxrss / 1024, seconds


QUEUED_RUNS, QUEUE_GPUS, RUN_SECONDS = 24, 4, 2


def _release_to_start(gpuenv: list[str], env: dict[str, str], image: str) -> tuple[float, float]:
    """On a one-GPU host: a run holds the GPU, a second one is queued for it (--wait) and
    prints when its command starts. The seconds from the first run's end (its gpuenv
    process exits, releasing the claim) to the second's command; and, for the baseline,
    from asking `docker run` to its command's start."""
    stamp = ["sh", "-c", "date +%s.%N"]
    holder = subprocess.Popen(
        [*gpuenv, "run", "--gpus", "1", "--", "sleep", "3"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    state = Path(env["GPUENV_STATE_DIR"])
    while not list(state.glob("claim.*.json")):
        time.sleep(0.01)
    queued = subprocess.Popen(
        [*gpuenv, "run", "--gpus", "1", "--wait", "--", *stamp],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    while holder.poll() is None:
        time.sleep(0.002)
    released = time.time()
    started = float(queued.communicate(timeout=60)[0].strip())
    asked = time.time()
    docker = subprocess.run(
        ["docker", "run", "--rm", image, *stamp], check=True, capture_output=True, text=True
    )
    return started - released, float(docker.stdout.strip()) - asked


def queue_rows() -> tuple[list[Row], str]:
    """The shared server under load: QUEUED_RUNS runs of RUN_SECONDS each, all asked at
    once for one GPU each with --wait on a described host of QUEUE_GPUS GPUs, against the
    ideal makespan (QUEUED_RUNS / QUEUE_GPUS waves of RUN_SECONDS); and how soon a queued
    run's command starts after the GPU it waits for is released, against how soon
    `docker run`'s command starts after it is asked."""
    if not os.environ.get("DOCKER_HOST") or not os.environ.get("GPUENV_REGISTRY_MIRROR"):
        return [], ""
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpuenv-bench-queue-") as tmp:
        project, gpuenv = _bench_project(tmp, "benchqueue", "# queue\n", "gpus: 1\n")
        image = subprocess.run(
            [*gpuenv, "build", "-q"], check=True, capture_output=True, text=True
        ).stdout.strip()
        makespans = []
        for run in range(RUNS):
            state = Path(tmp) / f"state-{run}"
            state.mkdir()
            env = {
                **os.environ,
                "GPUENV_STATE_DIR": str(state),
                "GPUENV_HOST_FILE": str(describe_host(Path(tmp) / "host.json", QUEUE_GPUS)),
            }
            started = time.perf_counter()
            runs = [
                subprocess.Popen(
                    [*gpuenv, "run", "--wait", "--", "sleep", str(RUN_SECONDS)],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                )
                for _ in range(QUEUED_RUNS)
            ]
            for child in runs:
                _, err = child.communicate(timeout=600)
                if child.returncode:
                    raise subprocess.CalledProcessError(child.returncode, child.args, stderr=err)
            makespans.append(time.perf_counter() - started)
        ideal = QUEUED_RUNS / QUEUE_GPUS * RUN_SECONDS
        rows.append(
            Row(
                f"{QUEUED_RUNS} queued {RUN_SECONDS}-second runs on {QUEUE_GPUS} GPUs: makespan",
                statistics.median(makespans),
                f"ideal ({QUEUED_RUNS // QUEUE_GPUS} waves of {RUN_SECONDS} s)",
                ideal,
                "≤ 1.2×",
                1.2,
            )
        )
        latencies, dockers = [], []
        for run in range(TARGET_RUNS):
            state = Path(tmp) / f"one-{run}"
            state.mkdir()
            env = {
                **os.environ,
                "GPUENV_STATE_DIR": str(state),
                "GPUENV_HOST_FILE": str(describe_host(Path(tmp) / "one.json", 1)),
            }
            latency, docker = _release_to_start(gpuenv, env, image)
            latencies.append(latency)
            dockers.append(docker)
        latency, docker = statistics.median(latencies), statistics.median(dockers)
        rows.append(
            Row(
                "a queued run's command starts, after the GPU's release",
                latency,
                "docker run's command starts, after it is asked",
                docker,
                "≤ docker run + 0.25 s",
                holds=latency <= docker + 0.25,
            )
        )
        subprocess.run([GPUENV, "-C", str(project), "gc", "--yes"], capture_output=True)
    return rows, ""


YEAR_RUNS = 50_000  # a year of a busy lab's runs


def _year_of_records(state: Path, runs: int = YEAR_RUNS) -> int:
    """`runs` runs' start and end records, as `UsageLog` writes them, in this user's file
    of a state folder of its own (written directly: 100,000 fsyncs would take minutes).
    Its size in bytes."""
    import random

    rng = random.Random(11)
    usage = state / "usage"
    usage.mkdir(parents=True)
    uid, now = os.getuid(), time.time()
    path = usage / f"{uid}.jsonl"
    with open(path, "w") as handle:
        for number in range(runs):
            start = now - rng.uniform(0, 365 * 86400)
            run_id = f"{number:016x}"
            gpus = [{"key": gpu_uuid(i), "model": "NVIDIA A100-SXM4-80GB"} for i in range(2)]
            start_record = {
                "event": "start",
                "id": run_id,
                "user": "bench",
                "uid": uid,
                "project": f"project{number % 40}",
                "start": start,
                "gpus": gpus,
                "host": "bench",
                "pid": 1,
                "pid_start": "1",
            }
            end = {"event": "end", "id": run_id, "end": start + rng.uniform(60, 8 * 3600)}
            end["exit"] = 0
            handle.write(json.dumps(start_record, sort_keys=True) + "\n")
            handle.write(json.dumps(end, sort_keys=True) + "\n")
    os.chmod(path, 0o600)
    return path.stat().st_size


def usage_rows() -> tuple[list[Row], str]:
    """`gpuenv usage` over a year of a busy lab's records (YEAR_RUNS runs), against the
    same command over none: what the records add, in time and in peak memory; and the
    dashboard's /api/usage answer (`usage_payload`, four sums) over the same records."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpuenv-bench-usage-") as tmp:
        year, empty = Path(tmp) / "year", Path(tmp) / "empty"
        size = _year_of_records(year)
        (empty / "usage").mkdir(parents=True)
        cache = Path(tmp) / "cache"
        measured: dict[str, list[tuple[float, float]]] = {"year": [], "empty": []}
        for name, state in (("year", year), ("empty", empty)):
            env = {**os.environ, "GPUENV_STATE_DIR": str(state), "GPUENV_CACHE_DIR": str(cache)}
            subprocess.run([GPUENV, "usage"], env=env, check=True, capture_output=True)  # indexes
            for _ in range(RUNS):
                mib, seconds = _peak_rss_mib([GPUENV, "usage"], env)
                measured[name].append((seconds, mib))
        year_s = statistics.median(t for t, _ in measured["year"])
        empty_s = statistics.median(t for t, _ in measured["empty"])
        rows.append(
            Row(
                f"`gpuenv usage`, a year of records ({YEAR_RUNS} runs, {size / 1e6:.0f} MB)",
                year_s,
                "the same command, no records",
                empty_s,
                "the records add ≤ 0.2 s",
                holds=year_s - empty_s <= 0.2,
            )
        )
        year_mib = statistics.median(m for _, m in measured["year"])
        empty_mib = statistics.median(m for _, m in measured["empty"])
        rows.append(
            Row(
                "`gpuenv usage`, a year of records: peak memory",
                year_mib,
                "the same command, no records",
                empty_mib,
                "≤ 1.25× (flat)",
                1.25,
                unit="MiB",
            )
        )
        script = (
            "import time, statistics; from gpuenv.app.dashboard import usage_payload\n"
            "usage_payload(None)\nt = []\n"
            "for _ in range(11):\n s = time.perf_counter(); usage_payload(None); "
            "t.append(time.perf_counter() - s)\nprint(statistics.median(t))\n"
        )
        answers = []
        for state in (year, empty):
            env = {**os.environ, "GPUENV_STATE_DIR": str(state), "GPUENV_CACHE_DIR": str(cache)}
            done = subprocess.run(
                [sys.executable, "-c", script], env=env, check=True, capture_output=True, text=True
            )
            answers.append(float(done.stdout.strip()))
        rows.append(
            Row(
                "/api/usage (7 and 30 days, by user and project), a year of records",
                answers[0],
                "the same, no records",
                answers[1],
                "≤ 0.2 s",
                holds=answers[0] <= 0.2,
            )
        )
    return rows, ""


BAKE_SIZE = 1024**3  # the large project: 1 GiB in files of 64 MiB


def bake_rows() -> tuple[list[Row], str]:
    """`gpuenv build --bake` of a 1 GiB project against the same project with a few small
    files: the context is streamed (memory independent of the project's size) and each
    file read once for the build (its digest remembered from the last one). The peak
    memory is each gpuenv process's own (ru_maxrss, measured in a child of its own)."""
    if not os.environ.get("GPUENV_REGISTRY_MIRROR"):
        return [], "bake rows skipped: no test registry (run through `make bench`)"
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpuenv-bench-bake-") as tmp:
        small, gpuenv_small = _bench_project(tmp, "bakesmall", "")
        large, gpuenv_large = _bench_project(tmp, "bakelarge", "")
        (small / "train.py").write_text("print('small')\n")
        data = large / "data"
        data.mkdir()
        block = os.urandom(1 << 20)
        for part in range(BAKE_SIZE // (64 << 20)):
            with open(data / f"part{part:02d}.bin", "wb") as handle:
                for _ in range(64):
                    handle.write(block)
        measured: dict[str, tuple[float, float]] = {}
        for name, gpuenv in (("small", gpuenv_small), ("large", gpuenv_large)):
            measured[name] = _peak_rss_mib([*gpuenv, "build", "--bake", "-q"])
        # The same large context, sent by a plain streaming upload (tar | curl -T -):
        # the engine's own time to take 1 GiB.
        context = Path(tmp) / "context"
        context.mkdir()
        (context / "Dockerfile").write_text("FROM scratch\nCOPY data /data\n")
        os.symlink(data, context / "data")
        started = time.perf_counter()
        tar = subprocess.Popen(["tar", "-C", str(context), "-ch", "."], stdout=subprocess.PIPE)
        subprocess.run(
            [
                "curl",
                "-sS",
                "--fail",
                "--unix-socket",
                os.environ["DOCKER_HOST"].removeprefix("unix://"),
                "-X",
                "POST",
                "-H",
                "Content-Type: application/x-tar",
                "-T",
                "-",
                "http://docker/v1.41/build?version=2&t=gpuenv-bench/bake-baseline:1",
            ],
            stdin=tar.stdout,
            check=True,
            capture_output=True,
        )
        tar.wait()
        baseline = time.perf_counter() - started
        subprocess.run(["docker", "rmi", "-f", "gpuenv-bench/bake-baseline:1"], capture_output=True)
        rows.append(
            Row(
                "build --bake, 1 GiB project: peak memory of gpuenv",
                measured["large"][0],
                "the same, a project of one small file",
                measured["small"][0],
                "≤ 1.25× (independent of the project's size)",
                1.25,
                unit="MiB",
            )
        )
        rows.append(
            Row(
                "build --bake, 1 GiB project (streamed context)",
                measured["large"][1],
                "the engine taking the same 1 GiB (tar | curl, streamed)",
                baseline,
            )
        )
        for project in (small, large):
            subprocess.run([GPUENV, "-C", str(project), "gc", "--yes"], capture_output=True)
    return rows, ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=REPO / "bench" / "results.md")
    output = parser.parse_args().output
    rows, notes = [], []
    sections = (
        core_rows,
        docker_rows,
        user_run_rows,
        dependency_rows,
        bake_rows,
        queue_rows,
        usage_rows,
    )
    for section in sections:
        try:
            section_rows, note = section()
        except subprocess.CalledProcessError as exc:
            # A failed command (on a machine shared with other work, an engine can kill a
            # build) is reported with the rows it cost, not hidden by a retry.
            err = exc.stderr or b""
            said = (err.decode(errors="replace") if isinstance(err, bytes) else err).splitlines()
            shown = " ".join(str(a) for a in exc.cmd[-4:])
            section_rows, note = (
                [],
                (
                    f"{section.__name__} stopped: `… {shown}` exited {exc.returncode}"
                    f" ({(said or ['no output'])[-1][:160]}); its rows are missing."
                ),
            )
        rows += section_rows
        if note:
            notes.append(note)
    notes += [f"Spread of “{row.what}” (quartiles): {row.spread}." for row in rows if row.spread]
    header = (
        f"Machine: {platform.node()}, {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}; {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; "
        f"medians of {RUNS} runs ({TARGET_RUNS} for the rows with a speed guard, "
        "21 for resolve()); rows with a ratio target take their samples in turns with their "
        "baseline's (ABAB), so other load on the machine hits both alike."
    )
    lines = [
        "| measurement | gpuenv | baseline | baseline | ratio | target | met |",
        "| --- | --- | --- | --- | --- | --- | --- |",
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
    output.write_text(report)


if __name__ == "__main__":
    main()
