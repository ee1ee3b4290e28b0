from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from gpuenv.common.versions import DriverVersion
from gpuenv.errors import HostError, UsageError
from gpuenv.host.detect import detect_host, detect_nvidia_smi, parse_nvidia_smi
from gpuenv.host.hostfile import load_host_file
from gpuenv.matrix.load import Matrix
from gpuenv.resolution.hostplan import HostPlan, describe_host

SMI_OUTPUT = """\
0, GPU-1a2b3c4d-0000-0000-0000-000000000000, NVIDIA A100-SXM4-80GB, 8.0, 81920, 535.104.05
1, GPU-1a2b3c4d-0000-0000-0000-000000000001, NVIDIA A100-SXM4-80GB, 8.0, 81920, 535.104.05
"""


def test_parse_nvidia_smi() -> None:
    host = parse_nvidia_smi(SMI_OUTPUT)
    assert host.driver == DriverVersion.parse("535.104.05")
    assert [g.index for g in host.gpus] == [0, 1]
    assert str(host.gpus[0].compute_capability) == "8.0"
    assert host.gpus[1].uuid == "GPU-1a2b3c4d-0000-0000-0000-000000000001"
    assert host.gpus[0].memory_total_mib == 81920
    assert (
        host.describe()
        == "driver 535.104.05, 2× NVIDIA A100-SXM4-80GB (detected through nvidia-smi)"
    )


def test_parse_old_nvidia_smi_without_compute_cap() -> None:
    fields = ("index", "uuid", "name", "memory.total", "driver_version")
    host = parse_nvidia_smi("0, GPU-x, Tesla V100-SXM2-32GB, 32768, 470.82.01\n", fields)
    assert host.gpus[0].compute_capability is None
    assert host.driver == DriverVersion.parse("470.82.01")


def test_this_machine_without_gpu_is_a_valid_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    host = detect_host()
    if host.source == "nvml":  # a GPU machine: the real thing answered
        assert host.driver and host.gpus
        return
    assert host.driver is None and host.gpus == () and host.source == "none"
    assert "nvidia-smi is not on PATH" in (host.note or "")


def test_nvidia_smi_fallback_runs_the_program(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stand-in nvidia-smi that, like nvidia-smi before 510, rejects the compute_cap field.
    script = tmp_path / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        'case "$1" in *compute_cap*) echo \'Field "compute_cap" is not a valid field to query.\'; exit 2;; esac\n'
        "echo '0, GPU-aaaa, Tesla T4, 15360, 470.82.01'\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(tmp_path))
    host = detect_nvidia_smi()
    assert not isinstance(host, str)
    assert host.gpus[0].name == "Tesla T4" and str(host.driver) == "470.82.01"


def write(tmp_path: Path, data: object) -> str:
    path = tmp_path / "host.json"
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return str(path)


def test_host_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(
        tmp_path,
        {
            "driver": "535.104.05",
            "gpus": [
                "NVIDIA GeForce RTX 4090",
                {
                    "index": 1,
                    "name": "NVIDIA A100-SXM4-80GB",
                    "uuid": "GPU-abc",
                    "compute_capability": "8.0",
                    "memory_total_mib": 81920,
                },
            ],
        },
    )
    monkeypatch.setenv("GPUENV_HOST_FILE", path)
    host = detect_host()
    assert host.source == f"file:{path}"
    assert [g.name for g in host.gpus] == ["NVIDIA GeForce RTX 4090", "NVIDIA A100-SXM4-80GB"]
    assert host.gpus[1].uuid == "GPU-abc"


def test_host_file_health_readings(tmp_path: Path) -> None:
    """The readings NVML gives for health, described: the same findings follow."""
    from gpuenv.monitoring.health import assess

    data = {
        "driver": "550.54.15",
        "gpus": [
            {
                "name": "A100",
                "temperature_c": 88,
                "slowdown_temperature_c": 85,
                "clocks_event_reasons": 32,
            },
            {"name": "A100", "pcie_width": 8, "pcie_width_max": 16, "xids": [79]},
            {"name": "A100", "lost": "GPU is lost"},
        ],
    }
    host = load_host_file(write(tmp_path, data))
    assert [[f.kind for f in assess(g)] for g in host.gpus] == [
        ["thermal"],
        ["xid", "pcie_width"],
        ["lost"],
    ]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("{not json", r":1:2: invalid JSON: Expecting property name"),
        ([], "expected a JSON object"),
        (
            {"driver": 535},
            r":1:2: field 'driver': expected a quoted driver version like \"535.104.05\", got the number 535 \(write it in quotes\)",
        ),
        ({"driver": "latest"}, "'latest' is not a driver version"),
        ({"driver": "535.1", "gpus": {}}, "field 'gpus': expected a list of GPUs"),
        ({"driver": "535.1", "gpus": [{"nme": "A100"}]}, "expected a GPU name or an object"),
        (
            {"driver": "535.1", "gpus": [{"name": "A100", "cc": "8.0"}]},
            r"field 'gpus\[0\].cc': unknown field 'cc'",
        ),
        (
            {"driver": "535.1", "gpus": [{"name": "A100", "compute_capability": "eight"}]},
            "is not a compute capability",
        ),
        (
            {"driver": "535.1", "gpus": ["A100", {"name": "A100", "index": 0}]},
            r"field 'gpus\[1\]': has the index 0 of gpus\[0\]",
        ),
        ({"gpus": ["A100"]}, "GPUs are listed but no 'driver'"),
        ({"driver": "535.1", "gpu": []}, "unknown field 'gpu'; did you mean 'gpus'"),
        (
            {"driver": "535.1", "gpus": [{"name": "A100", "lost": True}]},
            "'gpus\\[0\\].lost': expected a text saying why",
        ),
        (
            {"driver": "535.1", "gpus": [{"name": "A100", "xids": "79"}]},
            "expected a list of XID numbers",
        ),
        (
            {"driver": "535.1", "gpus": [{"name": "A100", "pcie_width": "x16"}]},
            "'gpus\\[0\\].pcie_width': expected a number, got 'x16'",
        ),
    ],
)
def test_bad_host_files(tmp_path: Path, data: object, message: str) -> None:
    with pytest.raises(HostError, match=message) as info:
        load_host_file(write(tmp_path, data))
    assert info.value.exit_code == 7
    assert "GPUENV_HOST_FILE=" in info.value.message


def test_a_host_file_says_every_problem_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "host.json"
    path.write_text(
        '{\n\t"driver": "latest",\n\t"gpus": [\n\t\t{"name": "A100", "index": -1}\n\t]\n}\n'
    )
    with pytest.raises(HostError) as info:
        load_host_file(str(path))
    assert info.value.message.splitlines() == [
        f"2 problems in GPUENV_HOST_FILE={path}:",
        f"  GPUENV_HOST_FILE={path}:2:2: field 'driver': 'latest' is not a driver version"
        " (expected numbers like 535.104.05)",
        f"  GPUENV_HOST_FILE={path}:4:20: field 'gpus[0].index': expected a whole number from 0"
        " to 4095, got the number -1",
    ]


def test_missing_host_file(tmp_path: Path) -> None:
    with pytest.raises(HostError, match="cannot read the host file"):
        load_host_file(str(tmp_path / "nope.json"))


def test_describe_host(matrix: Matrix) -> None:
    host = describe_host("535.104.05", ["a100", "RTX 4090"], matrix)
    assert [g.name for g in host.gpus] == ["A100", "RTX 4090"]
    assert [str(g.compute_capability) for g in host.gpus] == ["8.0", "8.9"]
    assert host.source == "flags"


@pytest.mark.parametrize(
    ("driver", "gpus", "message"),
    [
        ("535.104.05", ["RTX 9999 Hyper"], "not a GPU model gpuenv knows"),
        ("535.104.05", ["A1OO"], "Did you mean"),
        (None, ["A100"], "--gpu needs --driver too"),
        ("r535", [], "--driver: 'r535' is not a driver version"),
    ],
)
def test_describe_host_errors(
    matrix: Matrix, driver: str | None, gpus: list[str], message: str
) -> None:
    """A bad flag value is a usage error (exit 2) whatever the flag (issue 12, item 5)."""
    with pytest.raises(UsageError, match=message) as info:
        describe_host(driver, gpus, matrix)
    assert info.value.exit_code == 2


def test_flags_win_over_host_file(
    matrix: Matrix, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUENV_HOST_FILE", write(tmp_path, {"driver": "470.82.01"}))
    assert str(HostPlan("580.95.05").host(matrix).driver) == "580.95.05"
    assert str(HostPlan().host(matrix).driver) == "470.82.01"
    assert os.environ["GPUENV_HOST_FILE"]
