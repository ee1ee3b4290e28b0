"""The engine contract: the same cases against every adapter endpoint the test services
offer (Docker on its unix socket and over tcp:// on loopback, rootful and rootless
Podman). Each case asserts what the core relies on: values, absence, a refusal as
EngineRefused with its status (never a docker-py exception), an engine that is not
there as EngineError naming its address; and one CLI case on tcp://."""

from __future__ import annotations

import inspect
import io
import os
import socket
import tarfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuenv.engine.dockerpy import DockerEngine
from gpuenv.engine.failures import pull_error
from gpuenv.engine.podman import PodmanEngine
from gpuenv.engine.protocol import Engine, Event, Frame, frames
from gpuenv.errors import EngineError, EngineRefused, PullError
from gpuenv.images.progress import PullProgress

from ..contract_cases import CASES, a_missing_container_is_404_or_nothing_to_do, refusal
from .conftest import _missing, registry_digest

pytestmark = pytest.mark.integration

STAND_IN = "nvidia/pytorch"  # in the registry, built on Debian: it has sh
STAND_IN_TAG = "24.06-py3"
SHOW = "echo one; echo two; sleep 0.3; echo err >&2; sleep 0.3; echo three; exit 3"


@dataclass(frozen=True)
class Endpoint:
    name: str
    adapter: type[DockerEngine]
    address: str


ENDPOINTS = {
    "docker-unix": (DockerEngine, "DOCKER_HOST"),
    "docker-tcp": (DockerEngine, "GPUENV_TEST_DOCKER_TCP"),
    "podman": (PodmanEngine, "GPUENV_TEST_PODMAN"),
    "podman-rootless": (PodmanEngine, "GPUENV_TEST_PODMAN_ROOTLESS"),
}


@pytest.fixture(scope="module", params=list(ENDPOINTS))
def endpoint(request: pytest.FixtureRequest, docker_host: str) -> Endpoint:
    adapter, variable = ENDPOINTS[request.param]
    address = os.environ.get(variable, "")
    if not address:
        _missing(f"no test engine for {request.param}: {variable} is not set")
    if address.startswith("unix://") and not os.path.exists(address.removeprefix("unix://")):
        _missing(f"no test engine for {request.param} at {variable}={address!r}")
    return Endpoint(request.param, adapter, address)


@pytest.fixture(scope="module")
def engine(endpoint: Endpoint) -> Engine:
    return endpoint.adapter(endpoint.address)


@pytest.fixture(scope="module")
def image(engine: Engine, registry: str) -> Iterator[str]:
    """The stand-in, pulled, under a name of this module's own: another session's
    removal of the stand-in untags it and leaves this name (and the image) alone."""
    pulled(engine, f"{registry}/{STAND_IN}", STAND_IN_TAG)
    repository = f"{registry}/itest-contract/{uuid.uuid4().hex[:8]}"
    engine.tag(f"{registry}/{STAND_IN}:{STAND_IN_TAG}", repository, "1")
    yield f"{repository}:1"
    engine.remove_image(f"{repository}:1")


@pytest.fixture
def create(engine: Engine, image: str) -> Iterator[Callable[[str], str]]:
    """Containers of the stand-in running `sh -c COMMAND`, all removed afterwards."""
    made: list[str] = []

    def make(command: str) -> str:
        made.append(engine.create(container_config(image, command)))
        return made[-1]

    yield make
    for container in made:
        engine.remove(container)


def container_config(image: str, command: str) -> dict[str, Any]:
    return {
        "Image": image,
        "Cmd": ["sh", "-c", command],
        "Labels": {"io.gpuenv.itest": "engine-contract"},
        "AttachStdout": True,
        "AttachStderr": True,
        # As a run names its limits: then engine.podman names nofile and nproc too, at
        # most the service's own (engine.podman.service_limits).
        "HostConfig": {"Ulimits": [{"Name": "stack", "Soft": 8388608, "Hard": 8388608}]},
    }


def pulled(engine: Engine, repository: str, tag: str) -> list[Event]:
    """The pull's events; its failure as the image service reports it: a PullError
    raised by the adapter (Docker answers an unknown tag with 404), or an error event
    (Podman answers 200, then the error), made the same PullError."""
    events: list[Event] = []
    progress = PullProgress()
    for event in engine.pull(repository, tag, None):
        events.append(event)
        progress.feed(event)
        if progress.error:
            raise pull_error(f"{repository}:{tag}", progress.error)
    return events


def by_stream(parts: list[Frame]) -> dict[int, bytes]:
    joined: dict[int, bytes] = {}
    for kind, data in parts:
        joined[kind] = joined.get(kind, b"") + data
    return joined


def test_images_present_and_absent(engine: Engine, image: str, registry: str) -> None:
    digest = registry_digest(registry, STAND_IN, STAND_IN_TAG)
    assert engine.has_image(image)
    labels = (engine.image_config(image) or {}).get("Labels") or {}
    assert labels["io.gpuenv.stand-in"] == f"nvcr.io/{STAND_IN}:{STAND_IN_TAG}"
    assert f"{registry}/{STAND_IN}@{digest}" in engine.repo_digests(image)
    absent = f"{registry}/itest-contract/absent:never"
    assert engine.has_image(absent) is False
    assert engine.image_config(absent) is None
    assert engine.repo_digests(absent) == []


def test_a_pull_streams_progress_and_pins_the_registrys_digest(
    engine: Engine, registry: str
) -> None:
    events = pulled(engine, f"{registry}/{STAND_IN}", STAND_IN_TAG)
    assert events and all(isinstance(event, dict) for event in events)
    assert any("status" in event for event in events)
    digest = registry_digest(registry, STAND_IN, STAND_IN_TAG)
    reference = f"{registry}/{STAND_IN}:{STAND_IN_TAG}"
    assert f"{registry}/{STAND_IN}@{digest}" in engine.repo_digests(reference)


def test_a_pull_of_an_unknown_tag_is_a_pull_error(engine: Engine, registry: str) -> None:
    with pytest.raises(PullError) as refused:
        pulled(engine, f"{registry}/{STAND_IN}", "no-such-tag")
    assert f"{registry}/{STAND_IN}:no-such-tag does not exist" in refused.value.message
    assert refused.value.exit_code == 11


def test_a_container_runs_with_its_streams_apart(
    engine: Engine, create: Callable[[str], str]
) -> None:
    container = create(SHOW)
    stream, ahead = engine.attach(container, stdin=False)
    try:
        engine.start(container)
        output = [ahead]
        while chunk := stream.recv(65536):
            output.append(chunk)
    finally:
        stream.close()
    assert by_stream(list(frames(output, tty=False))) == {1: b"one\ntwo\nthree\n", 2: b"err\n"}
    assert engine.wait(container) == 3
    assert engine.inspect(container)["State"]["ExitCode"] == 3
    logged = list(engine.logs(container, follow=False))
    assert by_stream(logged) == {1: b"one\ntwo\nthree\n", 2: b"err\n"}
    assert list(engine.logs(container, follow=True, tail="2")) == [(2, b"err\n"), (1, b"three\n")]
    engine.remove(container)
    with pytest.raises(EngineRefused) as gone:
        engine.inspect(container)
    assert gone.value.status == 404


def test_archives_in_and_out(engine: Engine, create: Callable[[str], str]) -> None:
    container = create("true")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        member = tarfile.TarInfo("contract.txt")
        member.size = len(b"put and got\n")
        tar.addfile(member, io.BytesIO(b"put and got\n"))
    engine.put_archive(container, "/tmp", buffer.getvalue())
    got = engine.get_archive(container, "/tmp/contract.txt")
    assert got is not None
    with tarfile.open(fileobj=io.BytesIO(got)) as tar:
        read = tar.extractfile("contract.txt")
        assert read is not None and read.read() == b"put and got\n"
    assert engine.get_archive(container, "/no/such/path") is None


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_the_shared_contract(
    case: Callable[..., None], engine: Engine, create: Callable[[str], str]
) -> None:
    """The cases the unit tests' fake engine holds too (tests/contract_cases.py)."""
    if len(inspect.signature(case).parameters) == 2:
        case(engine, create)
    else:
        case(engine)


def test_every_kind_of_call_refused_is_engine_refused(
    engine: Engine, endpoint: Endpoint, image: str
) -> None:
    a_missing_container_is_404_or_nothing_to_do(engine)
    # An invalid reference (upper case): Docker answers 400, Podman 500; never "absent".
    for call in (engine.has_image, engine.image_config, engine.repo_digests):
        refused = refusal(lambda call=call: call("ITEST/Upper:1"))
        assert "lowercase" in refused.message
        assert endpoint.address in (refused.hint or "")
    refused = refusal(lambda: engine.remove_image(f"{image}-not-there"))
    assert refused.message.startswith(f"could not remove {image}-not-there: ")
    refused = refusal(lambda: engine.tag(f"{image}-not-there", "itest-contract/x", "1"))
    assert refused.message.startswith(f"could not tag {image}-not-there as itest-contract/x:1")
    refusal(lambda: engine.create(container_config(f"{image}-not-there", "true")))


def _nothing_listens(endpoint: Endpoint, tmp_path: Path) -> str:
    if endpoint.address.startswith("tcp://"):
        with socket.socket() as probe:  # a port that was free a moment ago
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        return f"tcp://127.0.0.1:{port}"
    name = "podman.sock" if endpoint.adapter is PodmanEngine else "docker.sock"
    return f"unix://{tmp_path}/{name}"


def test_an_engine_that_is_not_there(endpoint: Endpoint, tmp_path: Path) -> None:
    address = _nothing_listens(endpoint, tmp_path)
    engine = endpoint.adapter(address)
    product = "Podman service" if endpoint.adapter is PodmanEngine else "Docker engine"
    for call in (engine.ping, engine.version, lambda: engine.has_image("x:1"), engine.info):
        with pytest.raises(EngineError) as unreachable:
            call()
        assert (
            unreachable.value.message == f"cannot reach the {product} at {address}: is it running?"
        )
        assert unreachable.value.exit_code == 10
        assert unreachable.value.hint


def test_a_refusal_on_a_tcp_engine_is_located_exit_10_in_the_cli(make_project) -> None:
    """An engine's refusal of an image check over tcp:// was docker-py's APIError,
    "internal error" and exit 1: a mirror named in upper case makes the engine refuse
    the reference (400)."""
    address = os.environ.get("GPUENV_TEST_DOCKER_TCP", "")
    if not address:
        _missing("no test engine over tcp://: GPUENV_TEST_DOCKER_TCP is not set")
    project = make_project()
    project.ok("pull")  # pins the digest: the next pull asks has_image first
    result = project.gpuenv("pull", DOCKER_HOST=address, GPUENV_REGISTRY_MIRROR="MIRROR")
    assert result.returncode == 10, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0].startswith("error: ") and "MIRROR/nvidia/pytorch@sha256:" in lines[0]
    assert "repository name must be lowercase" in lines[0]
    assert lines[1] == f"hint: refused by the engine at {address} (HTTP 400)"
    assert "internal error" not in result.stderr
