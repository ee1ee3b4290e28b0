"""GPU-hours of real runs: attached, failed, stopped, and killed (its end written by the
next run's reaping), added up by `gpuenv usage` per user and project; each user reads
their own rows, root everyone's."""

from __future__ import annotations

import grp
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.scripted_nvml import ScriptedNvml, gpu, scenario

from ..jsonschemas import validate_output
from .conftest import Installed, Project, docker
from .test_shared import _container, _popen, describe

pytestmark = pytest.mark.integration


def records(state: Path) -> dict[str, tuple[float, float | None, int, object]]:
    """Run id -> (start, end, GPUs, exit), read straight from the usage files."""
    starts: dict[str, dict[str, object]] = {}
    ends: dict[str, dict[str, object]] = {}
    for path in (state / "usage").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            (starts if record["event"] == "start" else ends)[record["id"]] = record
    return {
        run_id: (
            float(start["start"]),  # type: ignore[arg-type]
            float(ends[run_id]["end"]) if run_id in ends else None,  # type: ignore[arg-type]
            len(start["gpus"]),  # type: ignore[arg-type]
            ends.get(run_id, {}).get("exit"),
        )
        for run_id, start in starts.items()
    }


def test_usage_adds_up_the_runs_of_this_test(
    make_project, tmp_path: Path, installed_for_users: Installed
) -> None:
    project: Project = make_project(spec="gpus: 1\n")
    project.ok("build", "-q")
    state = Path(tempfile.mkdtemp(prefix="gpuenv-usage-", dir="/tmp"))
    state.chmod(0o1777)
    nvml = ScriptedNvml(tmp_path)
    nvml.write(scenario(*(gpu(i) for i in range(4))))
    project.env.pop("GPUENV_HOST_FILE", None)
    project.env.update({**nvml.env, "GPUENV_STATE_DIR": str(state)})

    project.ok("run", "--gpus", "2", "--", "sleep", "2")  # attached: 2 GPUs, >= 2 s
    assert project.gpuenv("run", "--gpus", "1", "--", "sh", "-c", "exit 3").returncode == 3
    stopped = _popen(project, "run", "--gpus", "device=3", "--", "sleep", "300")
    container = _container(project)
    time.sleep(2)  # time passes: the stopped run lasts 2 s, which its record must show
    project.ok("stop", container[:12])
    stopped.communicate(timeout=60)
    killed = _popen(project, "run", "--gpus", "device=0", "--", "sleep", "300")
    orphan = docker("inspect", "-f", "{{.Name}}", _container(project)).stdout.strip().lstrip("/")
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=10)
    time.sleep(1)  # time passes: the orphan's removal ends its record a second later
    reaper = project.ok("run", "--gpus", "device=1", "--", "true")  # removes the orphan
    # The test engine is shared: another checkout's gpuenv may have removed the orphan
    # first (and an older one records nothing); then it stays unrecorded, and says so.
    reaped_here = f"removed {orphan}, left behind by a gpuenv run that was killed" in reaper.stderr

    seen = records(state)
    assert len(seen) == 5
    ended = {run_id: r for run_id, r in seen.items() if r[1] is not None}
    assert len(ended) == (5 if reaped_here else 4), seen
    exits = [str(code) for *_, code in ended.values()]
    assert exits.count("0") >= 2 and "3" in exits and str(stopped.returncode) in exits
    if reaped_here:
        assert "None" in exits  # the killed one: no exit code, its end when it was removed
    durations = sorted((end - start, gpus) for start, end, gpus, _ in ended.values())  # type: ignore[operator]
    assert any(seconds >= 2 and gpus == 2 for seconds, gpus in durations)
    expected = sum((end - start) * gpus for start, end, gpus, _ in ended.values()) / 3600  # type: ignore[operator]

    by_project = validate_output("usage", project.ok("usage", "--by", "project", "--json").stdout)
    (row,) = by_project["rows"]
    assert (row["key"], row["runs"]) == (project.name, len(ended))
    assert row["gpu_hours"] == pytest.approx(expected, abs=1e-4)
    assert by_project["running"] == 0 and by_project["unrecorded"] == 5 - len(ended)
    by_gpu = validate_output("usage", project.ok("usage", "--by", "gpu", "--json").stdout)
    assert [(r["key"], r["runs"]) for r in by_gpu["rows"]] == [
        ("NVIDIA A100-SXM4-80GB", len(ended))
    ]
    table = project.ok("usage", "--since", "1h", "--by", "project", COLUMNS="120").stdout
    assert project.name in table and f"{expected:.2f}" in table

    # With prices in the host config, a cost column.
    config = tmp_path / "host.yaml"
    config.write_text("currency: EUR\ngpu_hour_prices:\n  NVIDIA A100-SXM4-80GB: 3600\n")
    priced = validate_output(
        "usage",
        project.ok("usage", "--by", "project", "--json", GPUENV_HOST_CONFIG=str(config)).stdout,
    )
    assert priced["currency"] == "EUR"
    assert priced["rows"][0]["cost"] == pytest.approx(expected * 3600, abs=0.5)

    if os.getuid() != 0:
        return
    # Another user's run: their own rows for them, everyone's for root.
    uid = 4242
    os.chown(project.path, uid, uid)
    host = describe(state / "host.json")  # where that user can read it
    os.chmod(host, 0o644)
    user_env = installed_for_users.env(
        {
            **{k: v for k, v in project.env.items() if k not in nvml.env},
            "GPUENV_HOST_FILE": host,
            "HOME": "/tmp",
            "XDG_CACHE_HOME": f"/tmp/gpuenv-test-cache-{uid}",
            "GPUENV_DATA_DIR": str(state / f"data-{uid}"),
        }
    )
    docker_gid = grp.getgrnam("docker").gr_gid

    def as_user(*args: str) -> subprocess.CompletedProcess[str]:
        return installed_for_users.run_as(
            uid, "-C", str(project.path), *args, env=user_env, groups=[docker_gid]
        )

    theirs = as_user("run", "--gpus", "1", "--", "true")
    assert theirs.returncode == 0, theirs.stderr
    own = validate_output("usage", as_user("usage", "--by", "user", "--json").stdout)
    assert [(r["key"], r["runs"]) for r in own["rows"]] == [
        (str(uid) if not _named(uid) else _named(uid), 1)
    ]
    everyone = validate_output("usage", project.ok("usage", "--by", "user", "--json").stdout)
    assert sorted(r["runs"] for r in everyone["rows"]) == [1, len(ended)]
    assert (state / "usage" / f"{uid}.jsonl").stat().st_mode & 0o777 == 0o600


def _named(uid: int) -> str | None:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None
