"""`gpuenv idle` on the scripted NVML and a real claims store: a claimed GPU with no
process on it and one at 0 % with a process both count as idle for the window, a busy
one does not, and root's `--enforce` warns only the holder whose GPUs all stayed idle."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import GPUENV
from tests.jsonschemas import validate
from tests.scripted_nvml import ScriptedNvml, gpu, scenario

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
UUIDS = [gpu(i)["uuid"] for i in range(3)]

HOLDER = """
import sys, time
from gpuenv.reservations.claims import ClaimStore
store = ClaimStore()
with store.locked():
    store.add(sys.argv[2:], sys.argv[1])
print("ready", flush=True)
time.sleep(600)
"""


@pytest.fixture
def idle_host(tmp_path: Path) -> Iterator[tuple[dict[str, str], list[subprocess.Popen[str]]]]:
    config = tmp_path / "config.toml"
    config.write_text('[idle]\nthreshold = 5\nwarn_after = "2s"\nstop_after = "1h"\n')
    config.chmod(0o644)
    env = {k: v for k, v in os.environ.items() if k != "GPUENV_HOST_FILE"}
    env.update(
        GPUENV_STATE_DIR=str(tmp_path / "state"),
        GPUENV_SYSTEM_CONFIG=str(config),
        PYTHONPATH=str(REPO),
    )
    holders = []
    for project, gpus in (("quiet", UUIDS[:2]), ("busy", UUIDS[2:])):
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, project, *gpus],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        holders.append(holder)
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
    nvml = ScriptedNvml(tmp_path)
    nvml.write(
        scenario(
            gpu(0),  # claimed, no process, 0 %
            gpu(1, processes=[{"pid": holders[0].pid, "used_memory_mib": 512}]),  # 0 % with one
            gpu(2, utilization=90, processes=[{"pid": holders[1].pid, "used_memory_mib": 9000}]),
        )
    )
    env.update(nvml.env)
    try:
        yield env, holders
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()


def idle(env: dict[str, str], *args: str) -> dict[str, object]:
    result = subprocess.run(
        [*GPUENV, "idle", "--json", *args], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    validate("idle", data)
    return data


def test_idle_claims_are_seen_and_only_their_holder_is_warned(
    idle_host: tuple[dict[str, str], list[subprocess.Popen[str]]],
) -> None:
    env, _ = idle_host
    first = idle(env, "--enforce")
    assert first["log"] == []  # one sample: nothing has been idle for 2 s yet
    time.sleep(3)  # time passes: the GPUs stay idle for 3 s
    second = idle(env, "--enforce")
    seconds = {row["gpu"]: row["idle_seconds"] for row in second["claims"]}  # type: ignore[union-attr,index]
    assert seconds[UUIDS[0]] is not None and seconds[UUIDS[0]] >= 2  # no process at all
    assert seconds[UUIDS[1]] is not None and seconds[UUIDS[1]] >= 2  # a process, at 0 %
    assert seconds[UUIDS[2]] is None  # busy
    (entry,) = second["log"]  # type: ignore[misc]
    assert entry["kind"] == "warn" and "quiet" in entry["what"] and "busy" not in entry["what"]
    assert "stopped in 1h" in entry["what"]
    third = idle(env)  # a plain look keeps the warning on record and warns nobody again
    assert third["log"] == second["log"]
