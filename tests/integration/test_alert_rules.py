"""gpuenv's alert rules (gpuenv/monitoring/alert_rules.yml) checked and unit-tested by the
real `promtool` (Debian's `prometheus` package): every alert fires where it should and
stays quiet where it should not (tests/integration/alert_rules_test.yml)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpuenv.monitoring.metrics import ALERT_RULES

from .conftest import _missing

pytestmark = pytest.mark.integration

CASES = Path(__file__).with_name("alert_rules_test.yml")


def promtool() -> str:
    binary = shutil.which("promtool")
    if binary is None:
        _missing("no promtool (Debian package `prometheus`; scripts/services.sh up installs it)")
        raise AssertionError  # unreachable: _missing fails or skips
    return binary


@pytest.mark.parametrize(
    "command", [["check", "rules", str(ALERT_RULES)], ["test", "rules", str(CASES)]]
)
def test_promtool_checks_and_tests_the_rules(command: list[str]) -> None:
    result = subprocess.run(
        [promtool(), *command], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_is_tested_firing_and_quiet() -> None:
    alerts = {
        rule["alert"]
        for group in yaml.safe_load(ALERT_RULES.read_text())["groups"]
        for rule in group["rules"]
    }
    cases = [
        case
        for test in yaml.safe_load(CASES.read_text())["tests"]
        for case in test["alert_rule_test"]
    ]
    fired = {case["alertname"] for case in cases if case["exp_alerts"]}
    quiet = {case["alertname"] for case in cases if not case["exp_alerts"]}
    assert fired == alerts, alerts ^ fired
    assert quiet == alerts, alerts ^ quiet
