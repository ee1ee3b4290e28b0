"""Beyond one machine: push to the loopback registry, submit to the real Slurm, export to
Compose — end to end, as a non-root user."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from ..jsonschemas import validate_output
from .conftest import REPO, Installed, Project, docker, slurm_job, wait_for_job

pytestmark = pytest.mark.integration

JOB = """\
import os, sys
print("visible:", os.environ.get("NVIDIA_VISIBLE_DEVICES"), "slurm:", os.environ.get("SLURM_JOB_GPUS"))
open("result-%s.txt" % os.environ.get("SLURM_JOB_ID"), "w").write("done\\n")
sys.exit(int(sys.argv[1]))
"""


@dataclass(frozen=True)
class OtherUser:
    """A project owned by the test user, who runs gpuenv as installed for users."""

    project: Project
    user: pwd.struct_passwd
    installed: Installed

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.installed.run_as(
            self.user, "-C", str(self.project.path), *args, env=self.project.env
        )


@pytest.fixture
def tester(make_project, registry: str, installed_for_users: Installed) -> OtherUser:
    if os.getuid() != 0:
        pytest.skip("needs root to act as the test user")
    if not shutil.which("sbatch"):
        pytest.fail("Slurm is not installed: run `make test`, which sets it up", pytrace=False)
    user = pwd.getpwnam(os.environ.get("GPUENV_TEST_USER", "gpuenv-tester"))
    project = make_project(spec="gpus: 2\n")
    project.write("job.py", JOB)
    for path in [project.path, *project.path.iterdir()]:
        os.chown(path, user.pw_uid, user.pw_gid)
    cache = project.path.parent / f".cache-{user.pw_name}"
    cache.mkdir(exist_ok=True)
    os.chown(cache, user.pw_uid, user.pw_gid)
    project.env.update(HOME=user.pw_dir, USER=user.pw_name, XDG_CACHE_HOME=str(cache))
    return OtherUser(project, user, installed_for_users)


def test_push_submit_and_slurm_gpus(tester: OtherUser, registry: str) -> None:
    project, user = tester.project, tester.user
    repository = f"{registry}/itest/{project.name}"
    pushed = tester.run("push", repository)
    assert pushed.returncode == 0, pushed.stderr
    lock = yaml.safe_load((project.path / "gpuenv.lock").read_text())
    assert lock["pushed"]["image"] == pushed.stdout.strip()
    assert lock["pushed"]["image"].startswith(f"{repository}@sha256:")
    assert tester.run("lock", "--check").returncode == 0  # a push is not a spec change

    dry = tester.run("submit", "--dry-run", "job.py", "0")
    script = dry.stdout
    assert "#SBATCH --gres=gpu:2" in script and f"image={lock['pushed']['image']}" in script
    assert "changed since the last `gpuenv push`" not in dry.stderr

    submitted = tester.run("submit", "job.py", "0")
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip()
    fields = wait_for_job(job)
    assert fields["JobState"] == "COMPLETED", fields
    log = (project.path / ".gpuenv" / "slurm" / f"gpuenv-{project.name}-{job}.out").read_text()
    visible, slurm = log.split()[1], log.split()[3]
    assert visible == slurm and len(slurm.split(",")) == 2  # exactly the two GPUs Slurm granted
    result = project.path / f"result-{job}.txt"
    assert result.read_text() == "done\n"
    assert (result.stat().st_uid, result.stat().st_gid) == (user.pw_uid, user.pw_gid)

    failing = tester.run("submit", "--gpus", "1", "job.py", "3")
    fields = wait_for_job(failing.stdout.strip())
    assert fields["JobState"] == "FAILED" and fields["ExitCode"] == "3:0"

    # Code changed after the push: the pushed image carries the old code, and gpuenv says so.
    (project.path / "job.py").write_text(JOB + "\n# changed\n")
    assert (
        "changed since the last `gpuenv push`"
        in tester.run("submit", "--dry-run", "job.py", "0").stderr
    )

    sleeper = tester.run("submit", "--gpus", "1", "--", "sleep", "60")
    job = sleeper.stdout.strip()
    try:
        listed = validate_output("jobs", tester.run("jobs", "--json").stdout)
        assert job in [j["job"] for j in listed]
    finally:
        subprocess.run(["scancel", job], check=False)
        docker(
            "rmi",
            "-f",
            f"{repository}:{lock['pushed']['reference'].rsplit(':', 1)[1]}",
            check=False,
        )


def test_export_compose_is_valid(make_project, registry: str, tmp_path) -> None:
    if not shutil.which("docker-compose"):
        pytest.fail("docker-compose is not installed: run `make test`", pytrace=False)
    project = make_project(spec="gpus: [0, 2]\n")
    exported = project.ok("export", "compose", "-e", "TOKEN=s3cret-42", "train.py", "--lr", "3")
    assert "s3cret-42" not in exported.stdout + exported.stderr
    text = exported.stdout
    service = yaml.safe_load(text)["services"][project.name]
    assert service["command"] == ["python3", "train.py", "--lr", "3"]
    assert service["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == ["0", "2"]
    compose = tmp_path / "docker-compose.yaml"
    compose.write_text(text)
    checked = subprocess.run(
        ["docker-compose", "-f", str(compose), "config", "-q"], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stderr
    # The name without a value: Compose fills it from the environment it runs in.
    resolved = subprocess.run(
        ["docker-compose", "-f", str(compose), "config"],
        capture_output=True,
        text=True,
        env={**os.environ, "TOKEN": "from-the-shell"},
    )
    assert resolved.returncode == 0, resolved.stderr
    environment = yaml.safe_load(resolved.stdout)["services"][project.name]["environment"]
    assert environment["TOKEN"] == "from-the-shell"


def test_services_up_cancels_only_the_jobs_of_ended_test_sessions(
    installed_for_users: Installed,
) -> None:
    """`scripts/services.sh up` cancels the test user's gpuenv-itest-* jobs whose test
    session has ended, never those of a session still running (other checkouts share the
    cluster) nor any other job of that user."""
    if os.getuid() != 0:
        pytest.skip("needs root to act as the test user")
    if not shutil.which("sbatch"):
        pytest.fail("Slurm is not installed: run `make test`, which sets it up", pytrace=False)
    user = pwd.getpwnam(os.environ.get("GPUENV_TEST_USER", "gpuenv-tester"))
    ended = subprocess.Popen(["true"])
    ended.wait()  # a session that no longer runs
    tag = uuid.uuid4().hex[:8]
    cases = {
        "ended": (f"gpuenv-itest-{tag}-ended", ended.pid),
        "running": (f"gpuenv-itest-{tag}-running", os.getpid()),
        "not a test's": (f"gpuenv-{tag}-theirs", ended.pid),
    }
    jobs: dict[str, str] = {}
    bases: list[Path] = []
    try:
        for case, (name, pid) in cases.items():
            base = Path(tempfile.mkdtemp(prefix="gpuenv-itest-", dir="/tmp"))
            bases.append(base)
            base.chmod(0o755)
            (base / ".session-pid").write_text(f"{pid}\n")
            (base / "project").mkdir(mode=0o777)
            (base / "project").chmod(0o777)
            sbatch = ["sbatch", "--parsable", f"--job-name={name}", f"--chdir={base / 'project'}"]
            submitted = subprocess.run(
                installed_for_users.as_user(
                    user, *sbatch, "--output=/dev/null", "--wrap=sleep 300"
                ),
                capture_output=True,
                text=True,
            )
            assert submitted.returncode == 0, submitted.stderr
            jobs[case] = submitted.stdout.strip().split(";")[0]
        cancelled = subprocess.run(
            ["bash", "-c", ". scripts/lib.sh && cancel_orphaned_test_jobs"],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        assert cancelled.returncode == 0, cancelled.stderr
        assert f"cancelling Slurm job {jobs['ended']} " in cancelled.stderr
        # scancel returns once slurmctld has taken the request: the ended test's job is
        # cancelled, and the others would be by now had it named them.
        wait_for_job(jobs["ended"], 20, states=["CANCELLED"])
        for case in ("running", "not a test's"):
            assert slurm_job(jobs[case])["JobState"] in ("PENDING", "RUNNING"), case
    finally:
        if jobs:
            subprocess.run(["scancel", *jobs.values()], check=False)
        for base in bases:
            shutil.rmtree(base, ignore_errors=True)
