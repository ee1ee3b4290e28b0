"""MIG instances: found through NVML (the scripted library) or the host file, asked for
by UUID or by profile, and reserved through the same claims as whole GPUs."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

import pytest

from gpuenv.common.versions import DriverVersion
from gpuenv.errors import GpusBusy, HostError, SpecError, UsageError
from gpuenv.host.hostfile import load_host_file
from gpuenv.host.machine import Gpu, Host, MigDevice
from gpuenv.host.nvml import detect_nvml, mig_profile
from gpuenv.host.procfs import process_start
from gpuenv.project.spec import GpuRequest
from gpuenv.project.validate import parse_spec_text
from gpuenv.reservations.claims import Claim, ClaimStore
from gpuenv.reservations.gpus import Grant, choose, parse_gpus_option
from gpuenv.reservations.reserve import reserve
from tests.scripted_nvml import A100_PROFILES, ScriptedNvml, gpu, mig, mig_gpu, mig_uuid, scenario

# -- detection ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("named", "attributes", "profile", "source"),
    [
        (True, True, "2g.20gb", "nvml"),  # the GPU-instance profile's own name
        (True, False, "2g.20gb", "nvml"),
        (False, True, "2g.20gb", "derived"),  # from slices and memory, as go-nvlib does
        (False, False, None, None),  # neither: unknown, not guessed
    ],
)
def test_the_profile_of_an_instance(
    nvml: ScriptedNvml, named: bool, attributes: bool, profile: str | None, source: str | None
) -> None:
    instance = mig(0, 0, "2g.20gb", named=named, attributes=attributes)
    nvml.write(scenario(gpu(0, mig_mode=1, max_mig_devices=7, mig=[instance])))
    host = detect_nvml()
    assert not isinstance(host, str)
    (found,) = host.gpus[0].mig_devices
    assert (found.uuid, found.index, found.profile, found.profile_source) == (
        mig_uuid(0, 0),
        0,
        profile,
        source,
    )
    assert found.memory_total_mib == 19968
    assert found.utilization is None  # NVML does not read it per instance: unknown, not 0


def test_an_unprivileged_user_gets_the_derived_name(nvml: ScriptedNvml) -> None:
    """nvml.h: nvmlDeviceGetGpuInstanceById "Requires privileged user"; as anyone else
    the profile comes from the instance's attributes, which any user reads."""
    machine = mig_gpu(0, "3g.40gb")
    machine["fail"] = {"nvmlDeviceGetGpuInstanceById": "NO_PERMISSION"}
    nvml.write(scenario(machine))
    host = detect_nvml()
    assert not isinstance(host, str)
    (found,) = host.gpus[0].mig_devices
    assert (found.profile, found.profile_source) == ("3g.40gb", "derived")


def test_a_compute_instance_smaller_than_its_gpu_instance(nvml: ScriptedNvml) -> None:
    instance = mig(0, 0, "2g.20gb")
    instance["attributes"]["ci_slices"] = 1
    nvml.write(scenario(gpu(0, mig_mode=1, max_mig_devices=7, mig=[instance])))
    host = detect_nvml()
    assert not isinstance(host, str)
    assert host.gpus[0].mig_devices[0].profile == "1c.2g.20gb"


def test_processes_are_read_per_instance(nvml: ScriptedNvml) -> None:
    instance = mig(0, 1, processes=[{"pid": 4242, "used_memory_mib": 700}])
    machine = gpu(0, mig_mode=1, max_mig_devices=7, mig=[mig(0, 0), instance])
    machine["processes"] = [{"pid": 4242, "used_memory_mib": 700}]  # NVML's aggregate
    nvml.write(scenario(machine))
    host = detect_nvml()
    assert not isinstance(host, str)
    first, second = host.gpus[0].mig_devices
    assert first.processes == () and [(p.pid, p.used_memory_mib) for p in second.processes] == [
        (4242, 700)
    ]
    assert host.gpus[0].utilization is None  # not supported on a GPU in MIG mode


def test_an_instance_utilization_nvml_gives_is_shown(nvml: ScriptedNvml) -> None:
    nvml.write(scenario(gpu(0, mig_mode=1, max_mig_devices=7, mig=[mig(0, 0, utilization=42)])))
    host = detect_nvml()
    assert not isinstance(host, str)
    assert host.gpus[0].mig_devices[0].utilization == 42


@pytest.mark.parametrize("profile", list(A100_PROFILES))
def test_derived_names_match_nvidias(profile: str) -> None:
    _, slices, memory_mb = A100_PROFILES[profile]
    assert mig_profile(slices, slices, memory_mb, 81920) == profile


def test_the_host_describes_its_instances(nvml: ScriptedNvml) -> None:
    nvml.write(scenario(mig_gpu(0, "1g.10gb", "1g.10gb", "2g.20gb"), gpu(1)))
    host = detect_nvml()
    assert not isinstance(host, str)
    assert host.describe().endswith(
        "2× NVIDIA A100-SXM4-80GB (3 MIG instances) (detected through NVML)"
    )


def test_the_host_file_lists_instances(tmp_path: Path) -> None:
    path = tmp_path / "host.json"
    instances = [
        {"uuid": "MIG-1", "profile": "1g.10gb", "memory_total_mib": 9984, "index": 0},
        {"uuid": "MIG-2"},
    ]
    path.write_text(
        json.dumps({"driver": "550.54.15", "gpus": [{"name": "NVIDIA A100", "mig": instances}]})
    )
    (card,) = load_host_file(str(path)).gpus
    assert card.mig_mode is True
    assert card.mig_devices == (
        MigDevice(
            "MIG-1", memory_total_mib=9984, index=0, profile="1g.10gb", profile_source="host file"
        ),
        MigDevice("MIG-2"),  # what the file leaves out stays unknown
    )


@pytest.mark.parametrize(
    ("instances", "message"),
    [
        ({"uuid": "MIG-1"}, r"field 'gpus\[0\].mig': expected a list of MIG instances"),
        (["MIG-1"], r"field 'gpus\[0\].mig\[0\]': expected an object with at least 'uuid'"),
        ([{"profile": "1g.10gb"}], r"mig\[0\].uuid': expected a MIG UUID \(MIG-…\), got None"),
        ([{"uuid": "GPU-1"}], "expected a MIG UUID"),
        ([{"uuid": "MIG-1"}, {"uuid": "MIG-1"}], "MIG-1 is listed twice"),
        ([{"uuid": "MIG-1", "profile": "small"}], "'small' is not a MIG profile like 1g.10gb"),
        ([{"uuid": "MIG-1", "memory_total_mib": "10g"}], "memory_total_mib': expected a whole"),
        ([{"uuid": "MIG-1", "slices": 1}], "unknown field 'slices'"),
    ],
)
def test_host_file_instances_are_checked(tmp_path: Path, instances: Any, message: str) -> None:
    path = tmp_path / "host.json"
    path.write_text(
        json.dumps({"driver": "550.54.15", "gpus": [{"name": "NVIDIA A100", "mig": instances}]})
    )
    with pytest.raises(HostError, match=message) as info:
        load_host_file(str(path))
    assert info.value.exit_code == 7


# -- asking for instances ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpus: {mig: 1g.10gb, count: 2}", GpuRequest("mig", count=2, profile="1g.10gb")),
        ("gpus: {mig: 3g.40gb}", GpuRequest("mig", count=1, profile="3g.40gb")),
        ("gpus: {mig: 1c.2g.20gb}", GpuRequest("mig", count=1, profile="1c.2g.20gb")),
        ("gpus: [MIG-abc, GPU-def]", GpuRequest("devices", devices=("MIG-abc", "GPU-def"))),
    ],
)
def test_the_spec_asks_for_instances(tmp_path: Path, text: str, expected: GpuRequest) -> None:
    spec = parse_spec_text(f"framework: pytorch\n{text}\n", str(tmp_path))
    assert spec.gpus == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpus: {mig: 10gb}", "gpuenv.yaml:2:8: field 'gpus.mig': '10gb' is not a MIG profile"),
        ("gpus: {mig: 1g.10gb, count: 0}", "gpuenv.yaml:2:22: field 'gpus.count': the number 0"),
        ("gpus: {mig: 1g.10gb, count: two}", "'two' is not a count of at least 1"),
        ("gpus: {count: 2}", "gpuenv.yaml:2:1: field 'gpus': the MIG profile is missing"),
        ("gpus: {mig: 1g.10gb, memory: 10}", "field 'gpus.memory'"),
        ("gpus: {mig: 1g.10gb, memory: 10}", "unknown key 'memory' (known: mig, count)"),
    ],
)
def test_a_wrong_instance_request_is_located(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec_text(f"framework: pytorch\n{text}\n", str(tmp_path))
    found = [str(p) for p in info.value.problems]
    assert any(message in p for p in found), found


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        ("mig=1g.10gb", GpuRequest("mig", count=1, profile="1g.10gb")),
        ("mig=2g.20gb,count=3", GpuRequest("mig", count=3, profile="2g.20gb")),
        ("MIG-1,MIG-2", GpuRequest("devices", devices=("MIG-1", "MIG-2"))),
    ],
)
def test_the_gpus_option_asks_for_instances(option: str, expected: GpuRequest) -> None:
    assert parse_gpus_option(option) == expected


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("mig=", "expected mig=PROFILE or mig=PROFILE,count=N"),
        ("mig=1g.10gb,size=2", "expected mig=PROFILE"),
        ("mig=1g.10gb,count=0", "is not a count of at least 1"),
        ("mig=big", "'big' is not a MIG profile"),
    ],
)
def test_a_wrong_gpus_option_is_refused(option: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_gpus_option(option)


# -- reserving ---------------------------------------------------------------------------

M00, M01, M02 = mig_uuid(0, 0), mig_uuid(0, 1), mig_uuid(0, 2)


def mig_host() -> Host:
    """GPU 0 in MIG mode (1g.10gb, 1g.10gb, 2g.20gb), GPU 1 whole."""
    instances = tuple(
        MigDevice(mig_uuid(0, i), index=i, profile=p, profile_source="nvml")
        for i, p in enumerate(("1g.10gb", "1g.10gb", "2g.20gb"))
    )
    return Host(
        DriverVersion.parse("550.54.15"),
        (
            Gpu(0, "NVIDIA A100-SXM4-80GB", uuid="GPU-0", mig_mode=True, mig_devices=instances),
            Gpu(1, "NVIDIA A100-SXM4-80GB", uuid="GPU-1", mig_mode=False),
        ),
        "test",
    )


def claim(gpu: str) -> Claim:
    pid = os.getpid()
    return Claim(gpu, "alice", 1000, pid, process_start(pid), os.uname().nodename, "other", 0.0)


@pytest.mark.parametrize(
    ("option", "claims", "expected"),
    [
        ("mig=1g.10gb,count=2", [], (M00, M01)),
        ("mig=1g.10gb", [M00], (M01,)),
        ("mig=2g.20gb", [M00, M01], (M02,)),
        (M02, [M00], (M02,)),
        ("1", [], ("GPU-1",)),  # a whole GPU out of MIG mode first
        ("1", ["GPU-1"], ("GPU-0",)),  # a MIG GPU without claimed instances, whole
        ("GPU-1", [M00], ("GPU-1",)),
    ],
)
def test_choose_instances(option: str, claims: list[str], expected: tuple[str, ...]) -> None:
    granted, keys = choose(parse_gpus_option(option), mig_host(), [claim(c) for c in claims])
    assert granted == Grant("devices", expected)
    assert keys == list(expected)
    assert granted.visible_devices == ",".join(expected)


@pytest.mark.parametrize(
    ("option", "claims", "message"),
    [
        ("mig=1g.10gb", [M00, M01], r"1× MIG 1g.10gb requested, 0 free on this host \(MIG " + M00),
        ("mig=1g.10gb", ["GPU-0"], r"MIG MIG-\S+ of GPU 0: held by alice"),
        (M01, ["GPU-0"], "GPU 0: held by alice"),
        ("GPU-0", [M02], r"GPU 0 \(MIG\): MIG MIG-00000002: held by alice"),
        ("2", [M02], r"2 GPUs requested, 1 free on this host \(GPU 0 \(MIG\)"),
        ("all", [M00], r"GPU 0 \(MIG\): MIG"),
    ],
)
def test_a_gpu_and_its_instances_exclude_each_other(
    option: str, claims: list[str], message: str
) -> None:
    with pytest.raises(GpusBusy, match=message):
        choose(parse_gpus_option(option), mig_host(), [claim(c) for c in claims])


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("mig=3g.40gb", r"this host has 0 3g.40gb instance\(s\) \(2× 1g.10gb, 1× 2g.20gb\)"),
        ("mig=1g.10gb,count=3", "this host has 2 1g.10gb instance"),
        ("MIG-nothere", "no MIG instance with UUID MIG-nothere on this host"),
        (f"GPU-0,{M01}", "is a MIG instance of GPU 0, also requested whole"),
    ],
)
def test_instances_the_host_lacks(option: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        choose(parse_gpus_option(option), mig_host(), [])


def test_a_profile_request_avoids_instances_in_use() -> None:
    """A process NVML lists on an instance makes it not free for a profile request; an
    instance named by UUID is taken anyway, as a named GPU is."""
    from dataclasses import replace

    from gpuenv.host.machine import GpuProcess

    host = mig_host()
    first = replace(host.gpus[0].mig_devices[0], processes=(GpuProcess(4242),))
    busy_gpu = replace(host.gpus[0], mig_devices=(first, *host.gpus[0].mig_devices[1:]))
    host = replace(host, gpus=(busy_gpu, host.gpus[1]))
    assert choose(parse_gpus_option("mig=1g.10gb"), host, [])[1] == [M01]
    with pytest.raises(GpusBusy, match=f"MIG {M00}: busy with processes \\(pid 4242\\)"):
        choose(parse_gpus_option("mig=1g.10gb,count=2"), host, [])
    assert choose(parse_gpus_option(M00), host, [])[1] == [M00]


def test_instances_need_a_known_host() -> None:
    with pytest.raises(UsageError, match="this host's GPUs are not known"):
        choose(parse_gpus_option("mig=1g.10gb"), Host(None), [])


def _race(directory: str, option: str, queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    store = ClaimStore(directory)
    granted, names = reserve(store, parse_gpus_option(option), mig_host(), "race", 60, print)
    start = time.monotonic()  # the claim was on disk before this
    time.sleep(0.25)
    queue.put((list(granted.devices), start, time.monotonic()))  # released after this
    store.release(names)


def test_racing_reservations_of_instances_and_gpus_never_overlap(tmp_path: Path) -> None:
    """Eight processes at once: four want a 1g.10gb instance, two the 2g.20gb one by UUID,
    two GPU 0 whole. No instance is held twice, and GPU 0 never whole while any of its
    instances is held."""
    directory = str(tmp_path / "state")
    options = ["mig=1g.10gb"] * 4 + [M02] * 2 + ["GPU-0"] * 2
    queue: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    workers = [multiprocessing.Process(target=_race, args=(directory, o, queue)) for o in options]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=90)
        assert worker.exitcode == 0
    held = [queue.get(timeout=5) for _ in options]
    family = {M00: "GPU-0", M01: "GPU-0", M02: "GPU-0"}

    def clash(a: list[str], b: list[str]) -> bool:
        return any(x == y or family.get(x) == y or family.get(y) == x for x in a for y in b)

    for i, (keys_a, start_a, end_a) in enumerate(held):
        for keys_b, start_b, end_b in held[i + 1 :]:
            if clash(keys_a, keys_b):
                assert end_a <= start_b or end_b <= start_a, (keys_a, keys_b)
    assert sorted(k for keys, _, _ in held for k in keys).count("GPU-0") == 2


@pytest.mark.parametrize(
    "request_",
    [
        GpuRequest("mig", count=1, profile="1g.10gb"),
        GpuRequest("devices", devices=(M01,)),
    ],
)
def test_resolution_and_preflight_judge_the_instances_gpu(matrix, request_: GpuRequest) -> None:  # type: ignore[no-untyped-def]
    """An old V100 beside an A100 in MIG mode: asking for the A100's instances resolves
    as for the A100 alone (the V100 would hold the image back), as naming GPU 1 does."""
    from dataclasses import replace

    from gpuenv.resolution.resolve import resolve
    from tests.conftest import make_host
    from tests.unit.test_resolve import spec

    described = make_host("580.95.05", "Tesla V100-SXM2-32GB", "NVIDIA A100-SXM4-80GB")
    a100 = replace(
        described.gpus[1], uuid="GPU-1", mig_mode=True, mig_devices=mig_host().gpus[0].mig_devices
    )
    host = replace(described, gpus=(described.gpus[0], a100))
    assert resolve(spec(), matrix, host).row.tag == "24.12-py3"  # both GPUs
    assert resolve(spec().with_overrides(gpus=request_), matrix, host).row.tag == "26.09-py3"


def test_preflight_judges_the_granted_instances_gpu(matrix) -> None:  # type: ignore[no-untyped-def]
    """A granted instance is judged by its GPU: here (for the test's sake) slices of a
    GPU too old for the locked image, beside one that can run it."""
    from dataclasses import replace

    from gpuenv.containers.preflight import preflight
    from gpuenv.errors import ResolutionError
    from gpuenv.lock.locked import Locked
    from tests.conftest import make_host

    described = make_host("580.95.05", "Tesla V100-SXM2-32GB", "NVIDIA A100-SXM4-80GB")
    old = replace(
        described.gpus[0], uuid="GPU-0", mig_mode=True, mig_devices=mig_host().gpus[0].mig_devices
    )
    host = replace(described, gpus=(old, replace(described.gpus[1], uuid="GPU-1")))
    locked = Locked(
        "nvcr.io/nvidia/pytorch:26.10-py3",
        "hash",
        {"framework": "pytorch", "cuda": "13.0"},
        {"min_driver": "580.65.06", "min_compute_capability": "7.5"},
    )
    assert preflight(locked, host, Grant("devices", ("GPU-1",)), matrix) == []
    with pytest.raises(ResolutionError, match="this host cannot run the locked image"):
        preflight(locked, host, Grant("devices", (M01,)), matrix)


def test_a_gpu_whose_instances_run_processes_is_not_free_whole() -> None:
    """NVML lists a MIG GPU's processes per instance (its own list needs a privileged
    user): a GPU whose instance runs a process from outside gpuenv is not given whole."""
    from gpuenv.host.machine import GpuProcess

    busy = Gpu(
        0,
        "NVIDIA A100-SXM4-80GB",
        uuid="GPU-0",
        mig_mode=True,
        mig_devices=(MigDevice("MIG-0a", processes=(GpuProcess(4242),)),),
    )
    idle = Gpu(1, "NVIDIA A100-SXM4-80GB", uuid="GPU-1")
    granted, keys = choose(
        parse_gpus_option("1"), Host(DriverVersion.parse("550.54.15"), (busy, idle), "test"), []
    )
    assert granted.devices == ("GPU-1",)
    assert keys == ["GPU-1"]
    with pytest.raises(GpusBusy, match=r"GPU 0: busy with processes outside gpuenv \(pid 4242\)"):
        choose(
            parse_gpus_option("2"), Host(DriverVersion.parse("550.54.15"), (busy, idle), "test"), []
        )
