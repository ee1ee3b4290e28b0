"""`gpuenv export devcontainer` with the Dev Containers tools' own client (issue 34, items 3
and 4): `@devcontainers/cli` from npm (scripts/devcontainers-cli.sh) brings the exported
environment up on the shared-server tests' engine as Alice, an unprivileged user, and
`devcontainer exec` runs Python there that sees the locked packages, the granted GPU and
her uid. Its GPU is claimed like a run's while the container runs: Mallory's run cannot
take it, `ps` and `top` show it, and it is free again once the container stops; a GPU
Mallory holds refuses the editor, naming her; a lock changed since refuses it too, and
`lock --check` says the file is stale."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import RTX4090, _missing, gpuenv_failed
from .test_claims import Server, User, docker, engine, server  # noqa: F401 (fixtures)
from .test_shared import UUIDS

pytestmark = pytest.mark.integration

CLI = os.environ.get("GPUENV_TEST_DEVCONTAINER_CLI", "")
PROBE = (
    "import os, tabulate; print(os.getuid(), os.environ['NVIDIA_VISIBLE_DEVICES'], "
    "tabulate.__version__, os.getcwd(), os.environ['HOME'])"
)


@pytest.fixture
def editor(server: Server) -> Iterator[User]:  # noqa: F811 (the fixture imported above)
    """Alice's project: hers to write in, with a package from the test index locked."""
    if not CLI or not os.access(CLI, os.X_OK):
        _missing(f"no @devcontainers/cli at GPUENV_TEST_DEVCONTAINER_CLI={CLI!r}")
    alice = server.alice
    project = alice.project
    index = os.environ["GPUENV_TEST_INDEX"]
    project.write("requirements.txt", f"--index-url {index}\ntabulate\n")
    project.write(
        "gpuenv.yaml", project.path.joinpath("gpuenv.yaml").read_text() + "ports: [6006]\n"
    )
    project.ok("lock", *RTX4090)
    project.ok("build", "-q")
    for path in [project.path, *project.path.rglob("*")]:
        os.chown(path, alice.account.pw_uid, alice.account.pw_gid, follow_symlinks=False)
    yield alice


def devcontainer(user: User, command: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The `devcontainer` CLI's COMMAND on the user's project, as the user."""
    return subprocess.run(
        user.argv(CLI, command, "--workspace-folder", str(user.project.path), *args),
        capture_output=True,
        text=True,
        env=user.environment(),
        timeout=300,
    )


def outcome(result: subprocess.CompletedProcess[str]) -> dict[str, object]:
    """The JSON line `devcontainer up` ends its stdout with."""
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines, result.stdout + result.stderr
    return dict(json.loads(lines[-1]))


def claimed_by(user: User) -> list[object]:
    top = json.loads(user.gpuenv("top", "--once", "--json").stdout)
    return [gpu["claimed_by"] for gpu in top["gpus"]]


def wait_free(user: User, seconds: float = 60) -> list[object]:
    deadline = time.monotonic() + seconds
    while (holders := claimed_by(user)) != [None] * 4 and time.monotonic() < deadline:
        time.sleep(1)
    return holders


def test_an_editor_works_in_the_locked_environment_on_a_claimed_gpu(
    editor: User,
    server: Server,  # noqa: F811
) -> None:
    alice, mallory = editor, server.mallory
    exported = alice.gpuenv("export", "devcontainer")
    assert exported.returncode == 0, exported.stderr
    path = alice.project.path / ".devcontainer" / "devcontainer.json"
    text = path.read_text()
    assert text.startswith("// Written by `gpuenv export devcontainer`")
    config = json.loads("\n".join(line for line in text.splitlines() if not line.startswith("//")))
    written = config["customizations"]["gpuenv"]
    (gpu,) = written["gpus"]
    index = UUIDS.index(gpu)
    uid, gid = alice.account.pw_uid, alice.account.pw_gid
    assert config["containerUser"] == f"{uid}:{gid}"
    assert config["runArgs"][config["runArgs"].index("--gpus") + 1] == f'"device={gpu}"'
    assert config["forwardPorts"] == [6006]
    name = written["container"]

    up = devcontainer(alice, "up")
    assert outcome(up)["outcome"] == "success", up.stdout + up.stderr
    try:
        ran = devcontainer(alice, "exec", "python3", "-c", PROBE)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert ran.stdout.split()[-5:] == [
            str(uid),
            gpu,
            "0.10.0",
            "/workspace",
            f"/home/{alice.name}",
        ]
        # Claimed like a run's: Mallory's run cannot have it; ps and top show who has it.
        busy = mallory.gpuenv("run", "--gpus", f"device={index}", "--", "true")
        assert gpuenv_failed(busy, 16), busy.stderr
        assert f"held by {alice.name}" in busy.stderr and name in busy.stderr
        holders = claimed_by(mallory)
        assert holders[index] is not None and alice.name in str(holders[index])
        (run,) = [r for r in json.loads(alice.gpuenv("ps", "--json").stdout) if r["name"] == name]
        assert run["command"] == "devcontainer" and run["gpus"] == gpu
        assert run["state"] == "running" and run["detached"] is True
        assert run["uptime"] != "?"  # from when the engine made it
        # Opening it again while it runs keeps the one claim.
        again = devcontainer(alice, "up")
        assert outcome(again)["outcome"] == "success", again.stdout + again.stderr
        assert "held for" in again.stdout + again.stderr
    finally:
        docker("stop", name, check=False)
    # Stopped (the editor closed): the GPU is free once the rebuild grace has passed.
    assert wait_free(mallory) == [None] * 4
    ran = mallory.gpuenv("run", "--gpus", f"device={index}", "--", "true")
    assert ran.returncode == 0, ran.stderr

    # Mallory holds it now: reopening is refused, naming her, and nothing starts.
    holder = mallory.popen(
        *mallory.installed.argv(
            "-C",
            str(mallory.project.path),
            "run",
            "--gpus",
            f"device={index}",
            "--",
            "sleep",
            "300",
        )
    )
    try:
        deadline = time.monotonic() + 60
        while claimed_by(alice)[index] is None and time.monotonic() < deadline:
            time.sleep(0.5)
        refused = devcontainer(alice, "up")
        assert outcome(refused)["outcome"] == "error"
        said = refused.stdout + refused.stderr
        assert "the devcontainer's GPUs are taken" in said and mallory.name in said
        assert docker("inspect", "-f", "{{.State.Running}}", name).stdout.strip() == "false"
    finally:
        holder.terminate()
        holder.wait(timeout=60)

    # Exported again for another GPU: the stopped container, made from the first export,
    # is not started again as it was (with the old GPU, unclaimed): it is made anew.
    other = (index + 1) % len(UUIDS)
    alice.gpuenv("export", "devcontainer", "--gpus", f"device={other}").check_returncode()
    up = devcontainer(alice, "up")
    assert outcome(up)["outcome"] == "success", up.stdout + up.stderr
    try:
        assert "made from an earlier export" in up.stdout + up.stderr
        ran = devcontainer(alice, "exec", "python3", "-c", PROBE)
        assert ran.stdout.split()[-4] == UUIDS[other], ran.stdout + ran.stderr
        holders = claimed_by(mallory)
        assert alice.name in str(holders[other]) and holders[index] is None
        # Exported again while it runs, and rebuilt: the new GPU is claimed, and the old
        # one let go once the rebuild's grace has passed, while the new container runs.
        third = (index + 2) % len(UUIDS)
        alice.gpuenv("export", "devcontainer", "--gpus", f"device={third}").check_returncode()
        rebuilt = devcontainer(alice, "up", "--remove-existing-container")
        assert outcome(rebuilt)["outcome"] == "success", rebuilt.stdout + rebuilt.stderr
        ran = devcontainer(alice, "exec", "python3", "-c", PROBE)
        assert ran.stdout.split()[-4] == UUIDS[third], ran.stdout + ran.stderr
        deadline = time.monotonic() + 60
        while (holders := claimed_by(mallory))[other] is not None and time.monotonic() < deadline:
            time.sleep(1)
        assert holders[other] is None and alice.name in str(holders[third]), holders
    finally:
        docker("stop", name, check=False)
    assert wait_free(mallory) == [None] * 4

    # A lock changed since: lock --check says the file is stale, and opening is refused.
    lock = alice.project.path / "gpuenv.lock"
    lock.write_text(lock.read_text() + "# changed\n")
    checked = alice.gpuenv("lock", "--check")
    assert checked.returncode != 0 and ".devcontainer/devcontainer.json" in checked.stderr
    stale = devcontainer(alice, "up")
    assert outcome(stale)["outcome"] == "error"
    assert "gpuenv export devcontainer" in stale.stdout + stale.stderr


def test_a_devcontainer_json_of_your_own_is_left_alone(editor: User) -> None:
    own = editor.project.path / ".devcontainer"
    own.mkdir()
    (own / "devcontainer.json").write_text('{"image": "mine"}\n')
    refused = editor.gpuenv("export", "devcontainer")
    assert refused.returncode == 2, refused.stderr
    assert "gpuenv did not write it" in refused.stderr
    assert (own / "devcontainer.json").read_text() == '{"image": "mine"}\n'
    assert not list(Path(own).glob("*.tmp*"))
