"""Platforms (issue 11, item 3): an image built for another platform is rejected by the
resolver, refused before a build or a run, and named in the host file and the lock."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gpuenv.app.platforms import check_platform, engine_platform
from gpuenv.common.platforms import platform_of_machine, this_platform
from gpuenv.common.versions import DriverVersion
from gpuenv.errors import HostError, ResolutionError
from gpuenv.host.hostfile import load_host_file
from gpuenv.host.machine import Gpu, Host
from gpuenv.lock.lockfile import lock_from_resolution, recorded_host
from gpuenv.matrix.load import Matrix
from gpuenv.project.spec import default_spec
from gpuenv.resolution.resolve import resolve
from tests.unit.fake_engine import FakeEngine

H100 = (Gpu(0, "NVIDIA H100 80GB HBM3"),)


def _only(matrix: Matrix, platforms: tuple[str, ...]) -> Matrix:
    images = tuple(dataclasses.replace(r, platforms=platforms) for r in matrix.images)
    return dataclasses.replace(matrix, images=images)


@pytest.mark.parametrize(
    ("image_platforms", "host_platform", "fits"),
    [
        (("linux/amd64",), "linux/arm64", False),
        (("linux/amd64",), "linux/amd64", True),
        (("linux/amd64", "linux/arm64"), "linux/arm64", True),
        ((), "linux/arm64", True),  # not known: not checked
        (("linux/amd64",), None, True),  # a described host's platform: not known
    ],
)
def test_the_resolver_checks_the_platform(
    matrix: Matrix, image_platforms: tuple[str, ...], host_platform: str | None, fits: bool
) -> None:
    host = Host(DriverVersion.parse("570.124.06"), H100, "test", platform=host_platform)
    spec = default_spec(".", "pytorch")
    if fits:
        assert resolve(spec, _only(matrix, image_platforms), host).row.framework == "pytorch"
        return
    with pytest.raises(ResolutionError) as refused:
        resolve(spec, _only(matrix, image_platforms), host)
    assert "is built for linux/amd64; this host is linux/arm64" in "\n".join(
        refused.value.explanation
    )


def test_the_lock_records_both_platforms(matrix: Matrix) -> None:
    host = Host(DriverVersion.parse("570.124.06"), H100, "test", platform="linux/arm64")
    both = _only(matrix, ("linux/amd64", "linux/arm64"))
    lock = lock_from_resolution(resolve(default_spec(".", "pytorch"), both, host), both.version)
    assert lock.resolved["platforms"] == ["linux/amd64", "linux/arm64"]
    assert lock.resolved_for["platform"] == "linux/arm64"
    recorded = recorded_host(lock)
    assert recorded is not None and recorded.platform == "linux/arm64"


class _RemoteArm(FakeEngine):
    endpoint = "tcp://gh200.example:2376"

    def info(self) -> dict[str, object]:
        return {"Architecture": "aarch64", "OSType": "linux"}


def test_an_image_for_another_platform_is_refused_before_build_or_run() -> None:
    engine = _RemoteArm()
    assert engine_platform(engine) == "linux/arm64"  # type: ignore[arg-type]
    with pytest.raises(ResolutionError) as refused:
        check_platform("nvcr.io/nvidia/pytorch:25.03-py3", ["linux/amd64"], engine)  # type: ignore[arg-type]
    assert "built for linux/amd64, and this engine runs linux/arm64" in refused.value.message
    assert "gpuenv lock --upgrade" in (refused.value.hint or "")
    check_platform("x", ["linux/amd64", "linux/arm64"], engine)  # type: ignore[arg-type]
    check_platform("x", [], engine)  # type: ignore[arg-type]
    assert engine_platform(FakeEngine()) == this_platform()  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("machine", "platform"),
    [("x86_64", "linux/amd64"), ("aarch64", "linux/arm64"), ("ppc64le", None)],
)
def test_machines_and_platforms(machine: str, platform: str | None) -> None:
    assert platform_of_machine(machine) == platform


def test_the_host_file_names_a_platform(tmp_path: Path) -> None:
    path = tmp_path / "host.json"
    path.write_text(json.dumps({"driver": "570.124.06", "gpus": [], "platform": "linux/arm64"}))
    assert load_host_file(str(path)).platform == "linux/arm64"
    path.write_text(json.dumps({"driver": "570.124.06", "platform": "arm64"}))
    with pytest.raises(
        HostError, match="field 'platform': 'arm64' is not one of linux/amd64, linux/arm64"
    ):
        load_host_file(str(path))


def test_the_platform_flag(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from gpuenv.cli.tree import main

    args = ["-C", str(tmp_path), "resolve", "--framework", "pytorch", "--driver", "570.124.06"]
    good = CliRunner().invoke(main, [*args, "--gpu", "H100", "--platform", "linux/arm64", "--json"])
    assert good.exit_code == 0, good.output
    assert json.loads(good.stdout)["host"]["platform"] == "linux/arm64"
    bad = CliRunner().invoke(main, [*args, "--platform", "arm64"])
    assert bad.exit_code == 2  # a bad flag value is a usage error
