"""`gpuenv dashboard` in a real browser: Debian's headless Chromium, driven by Selenium
through Debian's chromedriver, loads the page against the scripted NVML and a real
claims store (a GPU held by a live process, a run queued, usage records, an hour of
history), and the page must show the GPU model, its holder, a drawn chart and
GPU-hours, with no console error. The JSON behind it is checked against its schemas."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import GPUENV, _missing
from tests.integration.test_exporter import (
    free_port,
    get,
    prometheus,  # noqa: F401 (a fixture this file uses)
    wait_for,
)
from tests.jsonschemas import validate
from tests.scripted_nvml import A100, ScriptedNvml, gpu, scenario

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SCREENSHOT = REPO / "docs" / "images" / "dashboard.png"
HELD = gpu(0)["uuid"]

# Takes a claim on GPU 0 and a place in the wait queue, and records an ended run of an
# hour, then holds them (the claim lives while this process holds its lock) until killed.
HOLDER = f"""
import os, sys, time
from gpuenv.reservations.claims import ClaimStore
from gpuenv.reservations.statedir import state_dir
from gpuenv.monitoring.usage import UsageLog
project = os.environ.get("GPUENV_TEST_PROJECT", "vision")
store = ClaimStore()
with store.locked():
    store.add([{HELD!r}], project)
ticket = store.enqueue()
log = UsageLog(state_dir())
run = log.begin(project, [({HELD!r}, {A100!r})], start=time.time() - 7200)
log.finish(run, 0, end=time.time() - 3600)
print("ready", flush=True)
while True:
    store.touch([ticket])
    time.sleep(0.5)
"""


def _seed_history(env: dict[str, str]) -> None:
    """An hour of samples of GPU 0 ramping up, written through the history store (as a
    sampler that ran before this dashboard would have)."""
    script = f"""
import time
from gpuenv.host.machine import Gpu
from gpuenv.monitoring.history import History
from gpuenv.reservations.statedir import open_state
history = History.for_sampling(open_state(), 16)
now = time.time()
for minute in range(60, 0, -1):
    g = Gpu(0, {A100!r}, uuid={HELD!r}, utilization=100 - minute, memory_used_mib=500 * minute,
            memory_total_mib=81920, temperature_c=40 + minute // 3, power_w=100.0 + minute,
            power_limit_w=400.0)
    history.record(now - minute * 60, [g], [])
history.close()
"""
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=60)


def _env(tmp_path: Path, nvml: ScriptedNvml, config: str | None = None) -> dict[str, str]:
    """gpuenv's environment here: the scripted NVML, a state folder of the test's own and,
    with `config`, that admin config (root's, not writable by others, as it must be)."""
    env = {k: v for k, v in os.environ.items() if k != "GPUENV_HOST_FILE"}
    env.update(nvml.env, GPUENV_STATE_DIR=str(tmp_path / "state"))
    if config is not None:
        path = tmp_path / "config.toml"
        path.write_text(config)
        path.chmod(0o644)
        env["GPUENV_SYSTEM_CONFIG"] = str(path)
    return env


@pytest.fixture
def browser() -> Iterator[Any]:
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver_path:
        _missing("no chromium or chromedriver (Debian packages chromium, chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1200"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def dashboard(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    with _dashboard(tmp_path, "vision") as running:
        yield running


@contextlib.contextmanager
def _dashboard(tmp_path: Path, project: str) -> Iterator[tuple[str, dict[str, str]]]:
    """A dashboard over a host whose GPU 0 runs hot with an XID, held by `project`."""
    nvml = ScriptedNvml(tmp_path)
    nvml.write(
        scenario(
            gpu(
                0,
                utilization=97,
                memory_used_mib=61440,
                temperature_c=82,
                power_mw=351000,
                clocks_event_reasons=0x20,
                xids=[79],
            ),
            gpu(1),
        )
    )
    env = _env(tmp_path, nvml, '[history]\ninterval = "1s"\nretention = "2d"\n')
    env["PYTHONPATH"] = str(REPO)
    env["GPUENV_TEST_PROJECT"] = project
    _seed_history(env)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER], env=env, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
    address = f"127.0.0.1:{free_port()}"
    process = subprocess.Popen(
        [*GPUENV, "dashboard", "--listen", address],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for("the dashboard answers", lambda: "gpuenv" in get(f"http://{address}/"))
        yield address, env
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
        holder.kill()
        holder.wait()
    assert process.returncode == 0, err


def test_the_page_shows_gpus_holders_charts_and_gpu_hours(
    dashboard: tuple[str, dict[str, str]], browser: Any
) -> None:
    address, _ = dashboard
    browser.get(f"http://{address}/")
    wait_for(
        "the page lists both GPUs and draws GPU 0's charts",
        lambda: browser.execute_script(
            "return document.querySelectorAll('.gpu').length === 2 && document.querySelectorAll("
            "'.gpu[data-key=\"' + arguments[0] + '\"] svg.chart polyline').length >= 4",
            HELD,
        ),
        seconds=30,
    )
    wait_for(
        "the GPU-hours tables are filled",
        lambda: "vision" in browser.find_element("id", "usage").text,
        seconds=30,
    )
    text = browser.find_element("tag name", "body").text
    assert A100 in text
    assert (
        "GiB of system memory for 160 GiB of GPU memory"
        in browser.find_element("id", "sizing").text
    )
    card = browser.find_element("css selector", f'.gpu[data-key="{HELD}"]').text
    assert "held by" in card and "(vision" in card
    assert "thermal slowdown on GPU 0" in card and "XID 79" in card
    free = browser.find_element("css selector", '.gpu:not([data-key="' + HELD + '"])').text
    assert "free" in free
    points = browser.execute_script(
        "return document.querySelector('.gpu[data-key=\"' + arguments[0] + '\"] "
        "svg.chart polyline').getAttribute('points').split(' ').length",
        HELD,
    )
    assert points >= 30  # an hour of minute samples, in 15-second buckets
    # an hour ended an hour ago counts in both periods, by user and by project
    hours = browser.execute_script(
        "return Array.from(document.querySelectorAll('table.usage tbody tr')).map(r => r.innerText)"
    )
    assert sum("vision" in row and "1.00" in row for row in hours) == 2
    assert len(browser.find_elements("css selector", "#queue tbody tr td")) >= 2
    assert "none" not in browser.find_element("id", "queue").text
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
    if os.environ.get("GPUENV_DASHBOARD_SCREENSHOT"):
        SCREENSHOT.parent.mkdir(exist_ok=True)
        browser.save_screenshot(str(SCREENSHOT))


NASTY_PROJECT = "[/]\x1b[2J\u202etxt.exe" + "n" * 10_000


def test_another_users_text_is_shown_not_applied(tmp_path: Path, browser: Any) -> None:
    """Issue 33, item 2: a project name with markup, a terminal escape, a BiDi override and
    10,000 characters is shown on the page as visible escapes, cut, never applied."""
    with _dashboard(tmp_path, NASTY_PROJECT) as (address, _):
        browser.get(f"http://{address}/")
        wait_for(
            "the page shows GPU 0's holder",
            lambda: "held by" in browser.find_element("tag name", "body").text,
            seconds=30,
        )
        card = browser.find_element("css selector", f'.gpu[data-key="{HELD}"] .holder').text
        assert "[/]\\x1b[2J\\u202etxt.exe" in card
        assert "\u202e" not in card and "\x1b" not in card
        assert "chars)" in card and len(card) < 1000
        usage = browser.find_element("id", "usage").text
        assert "\\u202e" in usage and "\u202e" not in usage


def test_the_json_behind_the_page_matches_its_schemas(
    dashboard: tuple[str, dict[str, str]],
) -> None:
    address, _ = dashboard
    gpus = json.loads(get(f"http://{address}/api/gpus"))
    validate("dashboard-gpus", gpus)
    held = next(g for g in gpus["gpus"] if g["key"] == HELD)
    assert held["holder"]["project"] == "vision" and held["holder"]["run"] is None
    assert [x["xid"] for x in held["recent_xids"]] == [79]
    assert gpus["queue"] and set(gpus["queue"][0]) == {"user", "since"}
    # no process IDs or command lines anywhere on the page's data
    assert "pid" not in json.dumps(gpus) and "command" not in json.dumps(gpus)
    # right-sizing: this machine's memory against the two scripted 80 GiB GPUs
    memory = next(f for f in gpus["sizing"] if f["check"] == "system memory")
    assert "GiB of system memory for 160 GiB of GPU memory" in memory["detail"]
    history = json.loads(get(f"http://{address}/api/history?gpu={HELD}&window=1h"))
    validate("dashboard-history", history)
    assert len(history["points"]) >= 55  # a point a minute, each in its own 15 s bucket
    day = json.loads(get(f"http://{address}/api/history?gpu={HELD}&window=1d"))
    assert 10 <= len(day["points"]) <= 13  # the same hour in 6-minute buckets
    validate("dashboard-usage", json.loads(get(f"http://{address}/api/usage")))


def test_the_sampler_keeps_sampling_and_history_survives_a_restart(tmp_path: Path) -> None:
    """Two dashboards one after the other, the first SIGKILLed: the second samples on
    into the same history (nothing left behind breaks it)."""
    nvml = ScriptedNvml(tmp_path)
    nvml.write(scenario(gpu(0, utilization=55)))
    env = _env(tmp_path, nvml, '[history]\ninterval = "1s"\n')
    count = (
        "import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute("
        "'select count(*) from samples').fetchone()[0])"
    )
    database = tmp_path / "state" / f"history-{os.getuid()}" / "gpus.sqlite"

    def samples() -> int:
        if not database.exists():
            return 0
        out = subprocess.run(
            [sys.executable, "-c", count, str(database)], capture_output=True, text=True
        )
        return int(out.stdout or 0)

    seen = 0
    for signal_to_send in (signal.SIGKILL, signal.SIGTERM):
        before = seen
        address = f"127.0.0.1:{free_port()}"
        process = subprocess.Popen(
            [*GPUENV, "dashboard", "--listen", address],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_for("new samples", lambda before=before: samples() >= before + 3, seconds=30)
            assert "this dashboard" in get(f"http://{address}/api/gpus")
        finally:
            process.send_signal(signal_to_send)
            process.communicate(timeout=30)
        seen = samples()
    assert seen >= 6


def test_history_from_prometheus(tmp_path: Path, prometheus: tuple[Path, Any]) -> None:  # noqa: F811
    """--prometheus: the charts read what a real Prometheus scraped from gpuenv exporter."""
    nvml = ScriptedNvml(tmp_path)
    nvml.write(scenario(gpu(0, utilization=40, memory_used_mib=2048)))
    env = _env(tmp_path, nvml)
    exporter_address, dashboard_address = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    exporter = subprocess.Popen(
        [*GPUENV, "exporter", "--listen", exporter_address],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    dashboard = None
    try:
        wait_for(
            "the exporter answers",
            lambda: "gpuenv_gpu_up" in get(f"http://{exporter_address}/metrics"),
        )
        _, start = prometheus
        server = start(exporter_address)
        dashboard = subprocess.Popen(
            [
                *GPUENV,
                "dashboard",
                "--listen",
                dashboard_address,
                "--prometheus",
                f"http://{server}",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        url = f"http://{dashboard_address}/api/history?gpu={HELD}&window=1h"
        # each reading is its own query: the first scrape may land between two of them
        history = wait_for(
            "the dashboard reads Prometheus' samples",
            lambda: [
                p
                for p in json.loads(get(url))["points"]
                if p["utilization"] is not None and p["memory_used_mib"] is not None
            ],
        )
        validate("dashboard-history", json.loads(get(url)))
        assert history[-1]["utilization"] == 40 and history[-1]["memory_used_mib"] == 2048
        assert json.loads(get(url))["source"] == f"prometheus:http://{server}"
        # no state folder history was made: Prometheus is the history
        assert not (tmp_path / "state" / f"history-{os.getuid()}").exists()
    finally:
        for process in (dashboard, exporter):
            if process is not None:
                process.send_signal(signal.SIGTERM)
                process.communicate(timeout=30)


def test_the_exporter_keeps_the_history_that_the_dashboard_top_and_doctor_read(
    tmp_path: Path,
) -> None:
    """`gpuenv exporter --history` as the sampler (a service's way): it records the
    readings and the XID NVML reports; the same user's dashboard reads them without
    sampling itself, and `top` and `doctor` name the XID with when it was recorded."""
    nvml = ScriptedNvml(tmp_path)
    nvml.write(scenario(gpu(0, utilization=70, xids=[79]), gpu(1)))
    env = _env(tmp_path, nvml, '[history]\ninterval = "1s"\n')
    published = tmp_path / "state" / f"history-{os.getuid()}" / "xids.json"
    exporter_address, dashboard_address = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    exporter = subprocess.Popen(
        [*GPUENV, "exporter", "--history", "--listen", exporter_address],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    dashboard = None
    try:
        wait_for("the exporter publishes the XID", lambda: published.exists(), seconds=30)
        assert json.loads(published.read_text())["xids"][0]["xid"] == 79
        dashboard = subprocess.Popen(
            [*GPUENV, "dashboard", "--listen", dashboard_address],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        gpus = json.loads(
            wait_for("the dashboard answers", lambda: get(f"http://{dashboard_address}/api/gpus"))
        )
        assert gpus["history"]["sampler"].startswith("another process of")
        assert [x["xid"] for x in gpus["gpus"][0]["recent_xids"]] == [79]
        history = json.loads(get(f"http://{dashboard_address}/api/history?gpu={HELD}&window=1h"))
        assert history["points"] and history["points"][-1]["utilization"] == 70
        top = subprocess.run(
            [*GPUENV, "top", "--json"], env=env, capture_output=True, text=True, timeout=60
        )
        health = json.loads(top.stdout)["gpus"][0]["health"]
        assert any("(XID 79), recorded at" in f["message"] for f in health), health
        doctor = subprocess.run(
            [*GPUENV, "doctor", "--json"], env=env, capture_output=True, text=True, timeout=120
        )
        checks = [c for c in json.loads(doctor.stdout) if c["name"] == "GPU 0 health"]
        assert any(c["status"] == "warn" and "recorded at" in c["detail"] for c in checks), checks
    finally:
        for process in (dashboard, exporter):
            if process is not None:
                process.send_signal(signal.SIGTERM)
                process.communicate(timeout=30)
    assert exporter.returncode == 0
