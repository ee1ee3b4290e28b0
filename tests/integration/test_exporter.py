"""`gpuenv exporter` on the scripted NVML, scraped by a real Prometheus (Debian's
`prometheus`, started here on loopback with its own data folder, stopped by pid),
and its output checked by `promtool check metrics`; under dcgm-exporter's names, every
expression of its Grafana dashboard (12239, vendored in tests/data/dcgm-exporter/)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.scripted_nvml import ScriptedNvml, gpu, scenario

from .conftest import GPUENV, REPO, Project, _missing
from .test_shared import _container, _popen

pytestmark = pytest.mark.integration

UUID0 = "GPU-00000000-1111-2222-3333-444444444444"
UUID1 = "GPU-00000001-1111-2222-3333-444444444444"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(url: str, timeout: float = 5) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # loopback only
        return str(response.read().decode())


def wait_for(what: str, check: Any, seconds: float = 60) -> Any:
    deadline = time.monotonic() + seconds
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except OSError as exc:
            last = exc
        time.sleep(0.5)
    raise AssertionError(f"{what} within {seconds:.0f}s (last: {last!r})")


def troubled() -> dict[str, Any]:
    return scenario(
        gpu(0, utilization=99, temperature_c=88, clocks_event_reasons=0x20, xids=[79]),
        gpu(1, utilization=40, pcie={"gen": 4, "max_gen": 4, "width": 8, "max_width": 16}),
        gpu(2, lost=True),
    )


@pytest.fixture
def exporter(tmp_path: Path, make_project) -> Iterator[tuple[str, Project, ScriptedNvml]]:
    project = make_project(spec="gpus: 1\n")
    project.ok("build", "-q")
    nvml = ScriptedNvml(tmp_path)
    nvml.write(troubled())
    project.env.pop("GPUENV_HOST_FILE", None)
    project.env.update(nvml.env)
    project.env["GPUENV_STATE_DIR"] = str(tmp_path / "state")
    address = f"127.0.0.1:{free_port()}"
    process = subprocess.Popen(
        [*GPUENV, "exporter", "--listen", address],
        env=project.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(
            "the exporter answers", lambda: "gpuenv_gpu_up" in get(f"http://{address}/metrics")
        )
        yield address, project, nvml
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)
    assert process.returncode == 0


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[Path, Any]]:
    """A Prometheus on loopback; `start(target)` scrapes the target every second."""
    binary = shutil.which("prometheus")
    if binary is None:
        _missing("no prometheus (Debian package `prometheus`; scripts/services.sh up installs it)")
        raise AssertionError  # unreachable: _missing fails or skips
    folder = tmp_path / "prometheus"
    folder.mkdir()
    started: list[subprocess.Popen[bytes]] = []

    def start(target: str) -> str:
        listen = f"127.0.0.1:{free_port()}"
        (folder / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: gpuenv\n"
            f"    static_configs:\n      - targets: ['{target}']\n"
        )
        log = (folder / "prometheus.log").open("wb")
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={folder / 'prometheus.yml'}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address={listen}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        started.append(process)
        (folder / "prometheus.pid").write_text(str(process.pid))
        wait_for("Prometheus is ready", lambda: "Ready" in get(f"http://{listen}/-/ready"))
        return listen

    try:
        yield folder, start
    finally:
        for process in started:  # by pid, this test's own
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def query(prometheus: str, promql: str) -> list[dict[str, Any]]:
    url = f"http://{prometheus}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    answer = json.loads(get(url))
    assert answer["status"] == "success", answer
    return list(answer["data"]["result"])


def test_prometheus_scrapes_the_exporter_with_the_right_labels(
    exporter: tuple[str, Project, ScriptedNvml], prometheus: tuple[Path, Any]
) -> None:
    address, project, _ = exporter
    run = _popen(project, "run", "--gpus", "device=1", "--", "sleep", "300")
    try:
        container = _container(project)
        name = json.loads(project.ok("ps", "--json").stdout)
        run_name = next(r["name"] for r in name if r["id"] == container)
        text = get(f"http://{address}/metrics")
        checked = subprocess.run(
            ["promtool", "check", "metrics"],
            input=text,
            capture_output=True,
            text=True,
            check=False,
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
        _, start = prometheus
        server = start(address)
        assert run.poll() is None, f"the run ended early: {run.communicate()}"
        held = wait_for(
            f"Prometheus has the run's GPU (run still going: {run.poll() is None})",
            lambda: query(server, f'gpuenv_gpu_utilization_ratio{{project="{project.name}"}}'),
        )
        (series,) = held
        labels = series["metric"]
        assert (labels["gpu"], labels["uuid"], labels["run"], labels["job"]) == (
            "1",
            UUID1,
            run_name,
            "gpuenv",
        )
        assert labels["user"] and "(" not in labels["user"]  # a name, no uid, no pid
        assert "pid" not in labels and "command" not in labels
        assert float(series["value"][1]) == 0.4
        thermal = query(server, 'gpuenv_gpu_health_problem{kind="thermal"}')
        assert [
            (s["metric"]["gpu"], s["metric"]["uuid"], s["metric"]["severity"]) for s in thermal
        ] == [("0", UUID0, "warn")]
        link = query(server, 'gpuenv_gpu_health_problem{kind="pcie_width"}')
        assert [(s["metric"]["gpu"], s["metric"]["project"]) for s in link] == [("1", project.name)]
        lost = query(server, "gpuenv_gpu_up == 0")
        assert [s["metric"]["gpu"] for s in lost] == ["2"]
        xid = query(server, "gpuenv_gpu_xid_errors_total")
        assert [(s["metric"]["gpu"], s["metric"]["xid"], s["value"][1]) for s in xid] == [
            ("0", "79", "1")
        ]
        reasons = query(server, 'gpuenv_gpu_clocks_event_reason{reason="sw_thermal_slowdown"} == 1')
        assert [s["metric"]["gpu"] for s in reasons] == ["0"]
        # Every expression of the documented Grafana dashboard runs and finds series.
        dashboard = json.loads((REPO / "docs" / "reference" / "grafana-dashboard.json").read_text())
        for panel in dashboard["panels"]:
            for target in panel["targets"]:
                found = query(server, target["expr"].replace("$instance", ".*"))
                assert found, f"dashboard panel {panel['title']!r} finds nothing"
    finally:
        run.send_signal(signal.SIGTERM)
        run.communicate(timeout=60)


def test_the_exporter_listens_on_loopback_and_says_when_it_cannot(tmp_path: Path) -> None:
    env = {**os.environ, **ScriptedNvml(tmp_path).env, "GPUENV_STATE_DIR": str(tmp_path / "state")}
    helptext = subprocess.run(
        [*GPUENV, "exporter", "--help"], capture_output=True, text=True, env=env, check=True
    )
    assert "127.0.0.1:9478" in helptext.stdout
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [*GPUENV, "exporter", "--listen", f"127.0.0.1:{port}"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
    assert result.returncode == 20
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in result.stderr
    bad = subprocess.run(
        [*GPUENV, "exporter", "--listen", "nowhere"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert bad.returncode == 2 and "expected HOST:PORT" in bad.stderr


DCGM_DASHBOARD = REPO / "tests" / "data" / "dcgm-exporter" / "dcgm-exporter-dashboard.json"
# DCP (profiling) fields DCGM reads from the GPU's performance counters: NVML has no such
# reading, so gpuenv serves none and the dashboard's Tensor Core panel stays empty.
NOT_FROM_NVML = {"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"}


def dashboard_queries(address: str) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target, with Grafana's variables as a user who
    picked this exporter's instance and all GPUs would have them."""
    dashboard = json.loads(DCGM_DASHBOARD.read_text())
    variables = {"$instance": address, "$gpu": ".+"}
    queries = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name, value in variables.items():
                expr = expr.replace(name, value)
            assert "$" not in expr, f"a Grafana variable left in {expr!r}"
            queries.append((panel["title"], expr))
    return queries


def test_dcgm_exporters_dashboard_finds_data_in_gpuenvs_dcgm_names(
    tmp_path: Path, prometheus: tuple[Path, Any]
) -> None:
    nvml = ScriptedNvml(tmp_path)
    nvml.write(
        scenario(
            gpu(
                0,
                name="NVIDIA GeForce RTX 4090",
                brand=5,  # NVML_BRAND_GEFORCE: a card DCGM does not support
                utilization=99,
                memory_total_mib=24564,
                memory_used_mib=20480,
                temperature_c=88,
                power_mw=301500,
                clocks_event_reasons=0x20,
                clocks_mhz={"sm": 2520, "memory": 10501},
                xids=[79],
            ),
            gpu(1, utilization=40),
            gpu(2, lost=True),
        )
    )
    env = {
        **os.environ,
        **nvml.env,
        "GPUENV_STATE_DIR": str(tmp_path / "state"),
        "GPUENV_SYSTEM_CONFIG": str(tmp_path / "no-config.toml"),
        "DOCKER_HOST": "unix:///nonexistent.sock",  # no engine: no runs, the GPUs still
    }
    env.pop("GPUENV_HOST_FILE", None)
    address = f"127.0.0.1:{free_port()}"
    process = subprocess.Popen(
        [*GPUENV, "exporter", "--names", "dcgm", "--listen", address],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        text = wait_for(
            "the exporter serves the XID",
            lambda: (
                (t := get(f"http://{address}/metrics")) and "DCGM_FI_DEV_XID_ERRORS{" in t and t
            ),
        )
        assert "gpuenv_gpu_" not in text  # --names dcgm: dcgm-exporter's names only
        # promtool's lint takes exception to one label name of dcgm-exporter's own,
        # modelName (camelCase), and to nothing else: with it renamed, the scrape is clean.
        linted = subprocess.run(
            ["promtool", "check", "metrics"], input=text, capture_output=True, text=True
        )
        problems = set((linted.stdout + linted.stderr).splitlines())
        assert {p.split(" ", 1)[1] for p in problems} == {
            "label names should be written in 'snake_case' not 'camelCase'"
        }, problems
        renamed = text.replace("modelName=", "model_name=")
        clean = subprocess.run(
            ["promtool", "check", "metrics"], input=renamed, capture_output=True, text=True
        )
        assert clean.returncode == 0, clean.stdout + clean.stderr
        _, start = prometheus
        server = start(address)
        wait_for("Prometheus has the DCGM series", lambda: query(server, "DCGM_FI_DEV_GPU_UTIL"))
        queries = dashboard_queries(address)
        found = {title: query(server, expr) for title, expr in queries}
        empty = {title for title, series in found.items() if not series}
        unservable = {t for t, expr in queries if any(name in expr for name in NOT_FROM_NVML)}
        assert empty == unservable == {"Tensor Core Utilization"}, empty
        assert len(found) == len(queries) == 8  # every panel of the dashboard, each once
        temps = {s["metric"]["gpu"]: s["value"][1] for s in found["GPU Temperature"]}
        assert temps == {"0": "88", "1": "34"}  # °C; the lost GPU 2 has no readings
        (power,) = found["GPU Power Total"]
        assert float(power["value"][1]) == 301.5 + 61  # W
        clocks = {s["metric"]["gpu"]: s["value"][1] for s in found["GPU SM Clocks"]}
        assert clocks == {"0": "2520000000", "1": "210000000"}  # MHz, times 10^6 by the panel
        used = {s["metric"]["gpu"]: s["value"][1] for s in found["GPU Framebuffer Mem Used"]}
        assert used == {"0": "20480", "1": "0"}  # MiB
        (rtx,) = query(server, 'DCGM_FI_DEV_GPU_UTIL{gpu="0"}')
        labels = rtx["metric"]
        assert (labels["modelName"], labels["UUID"], labels["device"], labels["pci_bus_id"]) == (
            "NVIDIA GeForce RTX 4090",
            UUID0,
            "nvidia0",
            "00000000:17:00.0",
        )
        assert labels["Hostname"] == socket.gethostname() and rtx["value"][1] == "99"
        assert labels["DCGM_FI_DRIVER_VERSION"] == "550.54.15"
        (free,) = query(server, 'DCGM_FI_DEV_FB_FREE{gpu="0"}')
        assert free["value"][1] == str(24564 - 20480)
        (reasons,) = query(server, 'DCGM_FI_DEV_CLOCKS_EVENT_REASONS{gpu="0"}')
        assert reasons["value"][1] == str(0x20)  # NVML's bitmask: SW thermal slowdown
        (xid,) = query(server, "DCGM_FI_DEV_XID_ERRORS")
        assert (xid["metric"]["gpu"], xid["metric"]["err_code"], xid["value"][1]) == (
            "0",
            "79",
            "79",
        )
        assert xid["metric"]["err_msg"] == "GPU has fallen off the bus"
        # The dashboard's variables: label_values(DCGM_FI_DEV_GPU_TEMP, instance|gpu).
        for label, values in (("instance", [address]), ("gpu", ["0", "1"])):
            url = f"http://{server}/api/v1/label/{label}/values?match[]=DCGM_FI_DEV_GPU_TEMP"
            assert json.loads(get(url))["data"] == values
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    assert process.returncode == 0, out + err
