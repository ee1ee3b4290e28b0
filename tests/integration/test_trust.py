"""Specs that cannot escalate and secrets that stay private, as an unprivileged user
(gpuenv-tester) against the real engine, registry and Slurm: a cloned repository's
gpuenv.yaml mounting the Docker socket and ~/.ssh, mounts outside the project, a baked
project with credentials, the sbatch script and its -e values."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import RTX4090, Installed, Project, docker, gpuenv_failed, wait_for_job

pytestmark = pytest.mark.integration

LIST_WORKSPACE = (
    "import os\n"
    "for root, dirs, files in os.walk('/workspace'):\n"
    "    for name in files: print(os.path.relpath(os.path.join(root, name), '/workspace'))\n"
)


@dataclass(frozen=True)
class UserProject:
    """A project owned by the test user, who runs gpuenv as installed for users, with a
    home folder of its own (holding ~/.ssh) and its own user config file."""

    project: Project
    user: pwd.struct_passwd
    installed: Installed
    home: Path

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return self.installed.run_as(
            self.user, "-C", str(self.project.path), *args, env=self.project.env, timeout=timeout
        )

    def own(self, *paths: Path) -> None:
        for path in paths:
            for root, dirs, files in os.walk(path):
                for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
                    os.chown(name, self.user.pw_uid, self.user.pw_gid)

    def config(self, text: str) -> None:
        path = self.home / ".config" / "gpuenv" / "config.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o600)
        self.own(self.home)


@pytest.fixture
def tester(make_project, installed_for_users: Installed) -> UserProject:
    if os.getuid() != 0:
        pytest.skip("needs root to act as the test user")
    user = pwd.getpwnam(os.environ.get("GPUENV_TEST_USER", "gpuenv-tester"))
    project = make_project(spec="gpus: none\n")
    home = project.path.parent / f"home-{project.name}"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    (home / ".ssh").chmod(0o700)
    cache = project.path.parent / f".cache-{project.name}"
    cache.mkdir()
    project.env.update(
        HOME=str(home),
        USER=user.pw_name,
        XDG_CACHE_HOME=str(cache),
        XDG_CONFIG_HOME=str(home / ".config"),
        GPUENV_DATA_DIR=str(home / "gpuenv-data"),
    )
    project.env.pop("GPUENV_CONFIG", None)
    made = UserProject(project, user, installed_for_users, home)
    made.own(project.path, home, cache)
    return made


def _spec(tester: UserProject, mounts: str) -> None:
    """Add `mounts` to the spec and lock again, as the repository would come."""
    path = tester.project.path / "gpuenv.yaml"
    path.write_text(path.read_text() + mounts)
    tester.project.ok("lock", *RTX4090)
    tester.own(tester.project.path)


def test_a_cloned_spec_cannot_mount_the_docker_socket_or_ssh(tester: UserProject) -> None:
    _spec(tester, "mounts:\n  - /var/run/docker.sock:/var/run/docker.sock\n  - ~/.ssh:/keys\n")
    lines = (tester.project.path / "gpuenv.yaml").read_text().splitlines()
    socket_line = lines.index("  - /var/run/docker.sock:/var/run/docker.sock") + 1
    for command in (["check"], ["run", "--", "true"]):
        refused = tester.run(*command)
        assert refused.returncode == 3 or gpuenv_failed(refused, 3), refused.stderr
        assert f"gpuenv.yaml:{socket_line}:" in refused.stderr
        assert f"gpuenv.yaml:{socket_line + 1}:" in refused.stderr
        assert "Docker engine's socket" in refused.stderr and "SSH keys" in refused.stderr
        assert "--allow-mount" in refused.stderr
    # The user's own config allowing them is not enough.
    tester.config(f"mounts:\n  allow: [/var/run, {tester.home}]\n")
    still = tester.run("run", "--", "true")
    assert gpuenv_failed(still, 3) and "SSH keys" in still.stderr, still.stderr
    # --allow-mount naming exactly ~/.ssh lets that one through (read-only: outside the
    # project); the socket stays refused.
    ssh = str(tester.home / ".ssh")
    half = tester.run("run", "--allow-mount", ssh, "--", "true")
    assert gpuenv_failed(half, 3) and "Docker engine's socket" in half.stderr
    assert "SSH keys" not in half.stderr
    _spec_without_socket = (tester.project.path / "gpuenv.yaml").read_text()
    (tester.project.path / "gpuenv.yaml").write_text(
        _spec_without_socket.replace("  - /var/run/docker.sock:/var/run/docker.sock\n", "")
    )
    tester.project.ok("lock", *RTX4090)
    tester.own(tester.project.path)
    allowed = tester.run(
        "run",
        "--allow-mount",
        ssh,
        "--",
        "sh",
        "-c",
        "cat /keys/id_ed25519 && touch /keys/planted; echo touch=$?",
    )
    assert allowed.returncode == 0, allowed.stderr
    assert "BEGIN OPENSSH PRIVATE KEY" in allowed.stdout and "touch=1" in allowed.stdout
    assert not (tester.home / ".ssh" / "planted").exists()


def test_mounts_outside_the_project_are_read_only(tester: UserProject) -> None:
    outside = tester.project.path.parent / f"data-{tester.project.name}"
    outside.mkdir()
    (outside / "f.txt").write_text("data\n")
    (tester.project.path / "inside").mkdir()
    (tester.project.path / "escape").symlink_to(outside)
    tester.own(outside, tester.project.path)
    _spec(tester, "mounts:\n  - escape:/escape\n  - inside:/inside\n")
    refused = tester.run("run", "--", "true")
    assert gpuenv_failed(refused, 3), refused.stderr
    assert "is outside the project" in refused.stderr and f"→ {outside}" in refused.stderr
    tester.config(f"mounts:\n  allow: [{outside}]\n")
    write = (
        "cat /escape/f.txt; touch /escape/new; echo escape=$?; touch /inside/new; echo inside=$?"
    )
    ran = tester.run("run", "--", "sh", "-c", write)
    assert ran.returncode == 0, ran.stderr
    assert "data" in ran.stdout and "escape=1" in ran.stdout and "inside=0" in ran.stdout
    assert "is mounted read-only" in ran.stderr
    assert not (outside / "new").exists() and (tester.project.path / "inside" / "new").exists()
    # --mount: the user's own choice, read-only by default, :rw to write.
    flag = tester.run(
        "run", "--mount", f"{outside}:/o", "--mount", f"{outside}:/w:rw", "--",
        "sh", "-c", "touch /o/a; echo o=$?; touch /w/b; echo w=$?",
    )  # fmt: skip
    assert flag.returncode == 0, flag.stderr
    assert "o=1" in flag.stdout and "w=0" in flag.stdout
    assert (outside / "b").exists() and not (outside / "a").exists()
    denied = tester.run("run", "--mount", "/etc:/host-etc", "--", "true")
    assert gpuenv_failed(denied, 2) and "--allow-mount /etc" in denied.stderr


def _workspace(tag: str) -> set[str]:
    listed = docker("run", "--rm", tag, "python3", "-c", LIST_WORKSPACE)
    return set(listed.stdout.split())


def test_bake_refuses_credentials_until_dockerignore_leaves_them_out(tester: UserProject) -> None:
    project = tester.project
    secrets = {
        ".aws/credentials": "[default]\naws_secret_access_key = x\n",
        "deploy/id_rsa": "-----BEGIN RSA PRIVATE KEY-----\n",
        ".env": "TOKEN=x\n",
        "certs/server.pem": "-----BEGIN CERTIFICATE-----\n",
        # by content (issue 33, item 10): names that say nothing
        "deploy_key": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n",
        "hf_token.txt": "hf_" + "QwErTyUiOpAsDfGhJkLzXcVbNmQwErTyUi" + "\n",
    }
    for name, text in {
        **secrets,
        "train.py": "print(1)\n",
        "docs/guide.md": "g\n",
        "docs/README.md": "r\n",
    }.items():
        (project.path / name).parent.mkdir(parents=True, exist_ok=True)
        (project.path / name).write_text(text)
    tester.own(project.path)
    refused = tester.run("build", "--bake")
    assert refused.returncode == 12, refused.stderr
    for name in secrets:
        assert name in refused.stderr
    assert ".dockerignore" in refused.stderr
    pushed = tester.run("push", f"{os.environ['GPUENV_TEST_REGISTRY']}/itest/{project.name}")
    assert pushed.returncode == 12 and ".aws/credentials" in pushed.stderr
    assert "deploy_key  (line 1: a private key" in pushed.stderr
    assert "hf_token.txt  (line 1: a Hugging Face token" in pushed.stderr
    # Docker's rules: anchored patterns, `**`, and a `!` that re-includes.
    project.write(
        ".dockerignore",
        ".aws\n**/id_rsa\n.env\ndocs\n!docs/README.md\ndeploy_key\nhf_token.txt\n",
    )
    tester.own(project.path)
    built = tester.run("build", "--bake", "--allow-secret", "certs/*.pem")
    assert built.returncode == 0, built.stderr
    assert "baked" in built.stderr and "of project" in built.stderr
    files = _workspace(built.stdout.strip())
    assert {"train.py", "docs/README.md", "certs/server.pem", "gpuenv.yaml"} <= files
    assert not {".aws/credentials", "deploy/id_rsa", ".env", "docs/guide.md"} & files
    assert "gpuenv.lock" not in files


JOB = """\
import os
print("token:", os.environ.get("JOB_TOKEN"), "file:", os.environ.get("FROM_FILE"))
"""


def test_the_sbatch_script_is_private_and_holds_no_values(
    tester: UserProject, registry: str
) -> None:
    if not shutil.which("sbatch"):
        pytest.fail("Slurm is not installed: run `make test`, which sets it up", pytrace=False)
    project = tester.project
    project.write("job.py", JOB)
    env_file = tester.home / "job.env"
    env_file.write_text("FROM_FILE=file-value-8c1e\n")
    tester.own(project.path, tester.home)
    repository = f"{registry}/itest/{project.name}"
    pushed = tester.run("push", repository)
    assert pushed.returncode == 0, pushed.stderr
    try:
        args = ["-e", "JOB_TOKEN=secret-value-5f2a", "--env-file", str(env_file), "job.py"]
        dry = tester.run("submit", "--dry-run", *args)
        assert dry.returncode == 0, dry.stderr
        assert "-e JOB_TOKEN" in dry.stdout and "-e FROM_FILE" in dry.stdout
        assert "secret-value-5f2a" not in dry.stdout and "file-value-8c1e" not in dry.stdout
        submitted = tester.run("submit", *args)
        assert submitted.returncode == 0, submitted.stderr
        job = submitted.stdout.strip()
        fields = wait_for_job(job)
        assert fields["JobState"] == "COMPLETED", fields
        folder = project.path / ".gpuenv" / "slurm"
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        (script,) = folder.glob("*.sbatch")
        assert stat.S_IMODE(script.stat().st_mode) == 0o600
        assert script.stat().st_uid == tester.user.pw_uid
        text = script.read_text()
        assert "JOB_TOKEN" in text and "secret-value-5f2a" not in text
        assert "file-value-8c1e" not in text
        for path in folder.iterdir():  # nothing gpuenv wrote holds a value
            if path.suffix == ".sbatch":
                assert "secret-value-5f2a" not in path.read_text()
        # The values reached the job all the same, through sbatch's environment.
        log = (folder / f"gpuenv-{project.name}-{job}.out").read_text()
        assert "token: secret-value-5f2a file: file-value-8c1e" in log
    finally:
        lock = (project.path / "gpuenv.lock").read_text()
        for line in lock.splitlines():
            if "reference:" in line and repository in line:
                docker("rmi", "-f", line.split("reference:", 1)[1].strip(), check=False)
