"""Handing the locked environment to a scheduler: the job's variables and GPU count,
`sbatch` of the generated script, and this project's jobs from `squeue`."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from gpuenv.common.files import atomic_write
from gpuenv.containers.config import env_entries, environment
from gpuenv.errors import UsageError
from gpuenv.project.spec import Spec

JOB_FIELDS = ("job", "state", "time", "nodes", "where")
FINISHED_FIELDS = (*JOB_FIELDS, "exit_code")
# What sacct says where slurmctld keeps no accounting (AccountingStorageType=none).
NO_ACCOUNTING = "accounting storage is disabled"


@dataclass(frozen=True)
class JobEnvironment:
    """A job's variables. `written`: the spec's env, which the script carries (it is in
    gpuenv.yaml already). `names`: every variable of -e and --env-file, which the script
    names but never gives a value. `values`: the values of -e KEY=VALUE and env files,
    which travel only in sbatch's own environment (sbatch exports it to the job)."""

    written: dict[str, str]
    names: list[str]
    values: dict[str, str]


def job_environment(spec: Spec, env: Sequence[str], env_files: Sequence[str]) -> JobEnvironment:
    """Split the job's variables into what may be written and what may not. A bare KEY,
    of -e or a line of an env file, is named: its value comes from the job's environment."""
    entries = env_entries(env, env_files)
    values = environment(replace(spec, env=()), env, env_files, {}, entries)
    names = list(dict.fromkeys([*values, *(key for key, _ in entries)]))
    written = {key: value for key, value in spec.env if key not in names}
    return JobEnvironment(written, names, values)


@dataclass(frozen=True)
class ExportedEnvironment:
    """An exported file's variables. `written`: the values it carries (the spec's env,
    which gpuenv.yaml has already; -e and --env-file values only when the user asked for
    them with --write-values). `referenced`: the -e and --env-file variables it names
    without a value, for the scheduler to fill (a Kubernetes Secret, the environment of
    `docker compose`)."""

    written: dict[str, str]
    referenced: list[str]


def exported_environment(
    spec: Spec, env: Sequence[str], env_files: Sequence[str], *, write_values: bool = False
) -> ExportedEnvironment:
    """The variables of an exported file. By default no value of -e or --env-file is
    written (exported files are printed, kept in logs and committed); `write_values`
    writes them, and then a bare -e KEY, which has no value to write, is refused."""
    if not write_values:
        job = job_environment(spec, env, env_files)
        return ExportedEnvironment(job.written, job.names)
    entries = env_entries(env, env_files)
    passthrough = [key for key, value in entries if value is None]
    if passthrough:
        raise UsageError(
            f"-e {passthrough[0]} (or a bare {passthrough[0]} line in an --env-file) has no "
            "value to write with --write-values",
            hint="give it as -e KEY=VALUE, or drop --write-values: the file then names "
            "the variable and the scheduler fills it",
        )
    values = environment(spec, env, env_files, {}, entries)
    return ExportedEnvironment(values, [])


def job_gpus(spec: Spec, gpus: int | None) -> int:
    """GPUs per job: --gpus, else the spec's count (devices counted, MIG instances too;
    `all` is one)."""
    if gpus is not None:
        return gpus
    request = spec.gpus
    if request.mode in ("count", "mig"):
        return request.count or 0
    if request.mode == "devices":
        return len(request.devices)
    return 0 if request.mode == "none" else 1


@dataclass(frozen=True)
class Submitted:
    job: str
    script: str


def private_folder(path: str) -> str:
    """`path` created (with its parents) and made 0700: job scripts and job output are
    the submitting user's alone."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    if os.stat(path).st_uid == os.getuid():
        os.chmod(path, 0o700)
    return path


def submit_script(
    directory: str,
    output_dir: str,
    name: str,
    script: str,
    values: Mapping[str, str] | None = None,
) -> Submitted:
    """Write the sbatch script (0600, into a 0700 folder) and submit it from the project
    folder; `values` go to sbatch in its environment, never into a file."""
    private_folder(output_dir)
    path = os.path.join(output_dir, f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.sbatch")
    atomic_write(path, script, mode=0o600)
    try:
        result = subprocess.run(
            ["sbatch", "--parsable", path],
            cwd=directory,
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, **(values or {})},
        )
    except FileNotFoundError:
        raise UsageError(
            "sbatch is not on PATH: this is not a Slurm login node",
            hint=f"run `sbatch {path}` on a Slurm login node (the script is written)",
        ) from None
    if result.returncode != 0:
        raise UsageError(
            f"sbatch refused the job ({path}): {result.stderr.strip()}",
            hint="fix what sbatch names (an --sbatch-arg, or the cluster's limits), then "
            "submit again",
        )
    return Submitted(result.stdout.strip().split(";")[0], path)


def parse_squeue(text: str) -> list[dict[str, str]]:
    """Rows of `squeue --format=%i|%T|%M|%D|%R`.

    >>> parse_squeue("17|RUNNING|1:02|1|node1\\n")
    [{'job': '17', 'state': 'RUNNING', 'time': '1:02', 'nodes': '1', 'where': 'node1'}]
    """
    rows = [line.split("|") for line in text.splitlines() if line.strip()]
    return [dict(zip(JOB_FIELDS, row, strict=False)) for row in rows]


def project_jobs(name: str) -> list[dict[str, str]]:
    """Pending and running jobs named `name` (squeue)."""
    try:
        result = subprocess.run(
            ["squeue", "--noheader", f"--name={name}", "--format=%i|%T|%M|%D|%R"],
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError:
        raise UsageError("squeue is not on PATH: this is not a Slurm login node") from None
    if result.returncode != 0:
        raise UsageError(f"squeue failed: {result.stderr.strip()}")
    return parse_squeue(result.stdout)


@dataclass(frozen=True)
class Finished:
    """Jobs that ended, from sacct; `rows` is None where Slurm keeps no accounting."""

    rows: list[dict[str, str]] | None
    reason: str = ""


def parse_sacct(text: str) -> list[dict[str, str]]:
    """Rows of `sacct --parsable2 --format=JobID,State,Elapsed,NNodes,NodeList,ExitCode`,
    ended jobs only.

    >>> parse_sacct("17|COMPLETED|00:00:02|2|mn[1-2]|0:0\\n18|RUNNING|00:00:01|1|mn1|0:0\\n")
    [{'job': '17', 'state': 'COMPLETED', 'time': '00:00:02', 'nodes': '2', 'where': 'mn[1-2]', \
'exit_code': '0:0'}]
    """
    rows = [line.split("|") for line in text.splitlines() if line.strip()]
    parsed = [dict(zip(FINISHED_FIELDS, row, strict=False)) for row in rows]
    return [row for row in parsed if row.get("state") not in ("PENDING", "RUNNING", None)]


def finished_jobs(name: str) -> Finished:
    """Jobs named `name` that ended in the last 7 days, where accounting is kept."""
    try:
        result = subprocess.run(
            [
                "sacct",
                "--noheader",
                "--parsable2",
                "--allocations",
                f"--name={name}",
                "--starttime=now-7days",
                "--format=JobID,State,Elapsed,NNodes,NodeList,ExitCode",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError:
        return Finished(None, "sacct is not on PATH")
    said = (result.stdout + result.stderr).strip()
    if NO_ACCOUNTING in said.lower():
        return Finished(None, "this cluster keeps no Slurm accounting (sacct: " + said + ")")
    if result.returncode != 0:
        return Finished(None, f"sacct failed: {said}")
    return Finished(parse_sacct(result.stdout))
