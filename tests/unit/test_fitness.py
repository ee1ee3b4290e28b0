"""Health decides allocation (issue 33, item 9): a GPU with uncorrected ECC errors, an XID
that calls for a reset or a hardware slowdown is not handed to a count request (nor to
the queue) while healthy ones exist; it shows as unhealthy, never free; asking for it by
index or UUID still works, with a warning; the admin drains a GPU by hand."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuenv.cli.tree import main
from gpuenv.common.siteconfig import SiteConfig
from gpuenv.common.versions import DriverVersion
from gpuenv.errors import GpuenvWarning, GpusBusy, UsageError
from gpuenv.host.machine import Gpu, Host
from gpuenv.monitoring.fitness import drained, fault, unfit_gpus
from gpuenv.reservations.gpus import choose, parse_gpus_option
from tests.scripted_nvml import ScriptedNvml, gpu, scenario
from tests.unit.test_claims import claim

FAILING = {  # GPU 1's state: each alone makes it unhealthy
    "uncorrected ECC": {"ecc_uncorrected": 3},
    "XID 79": {"xids": (79,)},
    "XID 48 (double-bit ECC)": {"xids": (48,)},
    "hardware slowdown": {"clocks_event_reasons": 0x8},
    "hardware thermal slowdown": {"clocks_event_reasons": 0x40},
    "power brake": {"clocks_event_reasons": 0x80},
}
HARMLESS = {  # readings that are no reason to skip a GPU
    "XID 13 (the program's fault)": {"xids": (13,)},
    "power cap": {"clocks_event_reasons": 0x4},
    "software thermal slowdown": {"clocks_event_reasons": 0x20},
    "idle": {"clocks_event_reasons": 0x1},
}


def machine(count: int = 4, **gpu1: object) -> Host:
    gpus = [Gpu(i, "NVIDIA A100-SXM4-80GB", uuid=f"GPU-{i}") for i in range(count)]
    if count > 1:
        gpus[1] = dataclasses.replace(gpus[1], **gpu1)  # type: ignore[arg-type]
    return Host(DriverVersion.parse("550.54.15"), tuple(gpus), "test")


def unfit_of(host: Host) -> dict[str, str]:
    return {g.key: why for g in host.gpus if (why := fault(g))}


@pytest.mark.parametrize("state", list(FAILING.values()), ids=list(FAILING))
def test_a_count_request_skips_a_failing_gpu(state: dict[str, object]) -> None:
    """GPU 0 is held, GPU 1 fails, GPUs 2 and 3 are idle: `--gpus 1` gets GPU 2, never 1
    (before: GPU 1, the first free)."""
    host = machine(**state)
    _, keys = choose(parse_gpus_option("1"), host, [claim("GPU-0")], unfit_of(host))
    assert keys == ["GPU-2"]


@pytest.mark.parametrize("state", list(HARMLESS.values()), ids=list(HARMLESS))
def test_harmless_readings_do_not_skip_a_gpu(state: dict[str, object]) -> None:
    host = machine(**state)
    assert unfit_of(host) == {}
    _, keys = choose(parse_gpus_option("1"), host, [claim("GPU-0")], unfit_of(host))
    assert keys == ["GPU-1"]


def test_a_count_request_waits_for_healthy_gpus_rather_than_take_a_failing_one() -> None:
    """Healthy GPUs exist but are held: the request is busy (and queues with --wait),
    naming the failing one and why."""
    host = machine(ecc_uncorrected=1)
    held = [claim("GPU-0"), claim("GPU-2"), claim("GPU-3")]
    with pytest.raises(GpusBusy) as busy:
        choose(parse_gpus_option("1"), host, held, unfit_of(host))
    assert "GPU 1: unhealthy: 1 uncorrected ECC error" in busy.value.message


def test_with_too_few_healthy_gpus_a_failing_one_is_given_with_a_warning() -> None:
    """A workstation with one GPU, which slows down: its owner still runs, and is told."""
    host = Host(
        DriverVersion.parse("550.54.15"),
        (Gpu(0, "RTX 4090", uuid="GPU-0", clocks_event_reasons=0x8),),
        "t",
    )
    with pytest.warns(GpuenvWarning, match="unhealthy ones may be given"):
        _, keys = choose(parse_gpus_option("1"), host, [], unfit_of(host))
    assert keys == ["GPU-0"]


def test_a_drained_gpu_is_never_given_to_a_count() -> None:
    host = Host(DriverVersion.parse("550.54.15"), (Gpu(0, "A100", uuid="GPU-0"),), "t")
    with pytest.raises(GpusBusy, match="GPU 0: drained by the admin"):
        choose(parse_gpus_option("1"), host, [], {"GPU-0": "drained by the admin (x)"})


@pytest.mark.parametrize("option", ["device=1", "GPU-1", "1,2"])
def test_a_failing_gpu_asked_for_by_name_is_given_with_a_warning(option: str) -> None:
    host = machine(xids=(79,))
    with pytest.warns(GpuenvWarning, match="GPU 1 is unhealthy: XID 79"):
        _, keys = choose(parse_gpus_option(option), host, [], unfit_of(host))
    assert "GPU-1" in keys


def test_a_healthy_named_gpu_gives_no_warning() -> None:
    host = machine(xids=(79,))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        choose(parse_gpus_option("device=2"), host, [], unfit_of(host))


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ({}, frozenset()),
        ({"gpus": {"drain": [1, "GPU-abc"]}}, frozenset({"1", "GPU-abc"})),
    ],
)
def test_drain_setting(table: dict[str, object], expected: frozenset[str]) -> None:
    assert drained(SiteConfig("/etc/gpuenv/config.toml", table)) == expected


@pytest.mark.parametrize("value", ["1", [True], [-1], [1.5], {"a": 1}])
def test_a_bad_drain_setting_is_named(value: object) -> None:
    with pytest.raises(UsageError, match=r"\[gpus\] drain"):
        drained(SiteConfig("/etc/gpuenv/config.toml", {"gpus": {"drain": value}}))


@pytest.fixture
def failing_host(nvml: ScriptedNvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The issue's host: GPU 1 with uncorrected ECC errors, XID 79 and a hardware
    slowdown; GPUs 0 and 2 healthy; GPU 2 drained by the admin's config."""
    nvml.write(
        scenario(
            gpu(0),
            gpu(
                1,
                ecc={"corrected_volatile": 0, "uncorrected_volatile": 2},
                xids=[79],
                clocks_event_reasons=0x8,
            ),
            gpu(2),
        )
    )
    config = tmp_path / "config.toml"
    config.write_text(f'[gpus]\ndrain = ["{gpu(2)["uuid"]}"]\n')
    config.chmod(0o644)
    monkeypatch.setenv("GPUENV_SYSTEM_CONFIG", str(config))
    monkeypatch.setenv("GPUENV_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/gpuenv-test.sock")
    return config


def test_top_shows_unhealthy_and_drained_never_free(failing_host: Path) -> None:
    from gpuenv.host.detect import detect_host

    data = CliRunner().invoke(main, ["top", "--json"])
    assert data.exit_code == 0, data.output
    rows = {row["index"]: row for row in json.loads(data.stdout)["gpus"]}
    assert rows[0]["unfit"] is None
    assert rows[1]["unfit"].startswith("unhealthy: 2 uncorrected ECC errors")
    assert rows[2]["unfit"].startswith("drained by the admin")
    table = CliRunner().invoke(main, ["top", "--once"], env={"COLUMNS": "250"})
    lines = {line.split("\t")[0]: line for line in table.stdout.splitlines()}
    assert lines["0"].endswith("free")
    assert "unhealthy" in lines["1"] and "free" not in lines["1"].split("\t")[-1]
    assert "drained by the admin" in lines["2"]
    assert set(unfit_gpus(detect_host())) == {rows[1]["uuid"], rows[2]["uuid"]}


def test_mig_instances_of_a_failing_gpu_come_last() -> None:
    """Two MIG GPUs with 1g.10gb instances, the first failing: a request for one gets an
    instance of the healthy GPU; one for more than it has gets the failing one's too."""
    from gpuenv.host.machine import MigDevice
    from tests.scripted_nvml import mig_uuid

    def mig_gpu(index: int, **state: object) -> Gpu:
        instances = tuple(
            MigDevice(mig_uuid(index, i), index=i, profile="1g.10gb", profile_source="nvml")
            for i in range(2)
        )
        return Gpu(
            index, "A100", uuid=f"GPU-{index}", mig_mode=True, mig_devices=instances, **state
        )  # type: ignore[arg-type]

    host = Host(DriverVersion.parse("550.54.15"), (mig_gpu(0, ecc_uncorrected=1), mig_gpu(1)), "t")
    unfit = unfit_of(host)
    _, keys = choose(parse_gpus_option("mig=1g.10gb"), host, [], unfit)
    assert keys == [mig_uuid(1, 0)]
    with pytest.warns(GpuenvWarning, match="instances of GPU 0 are given"):
        _, keys = choose(parse_gpus_option("mig=1g.10gb,count=3"), host, [], unfit)
    assert len(keys) == 3 and mig_uuid(1, 0) in keys and mig_uuid(1, 1) in keys
