"""`gpuenv matrix sync` against the real test registry (scripts/services.sh): stand-in
images whose configs carry NGC's metadata, one of them a multi-platform index."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuenv.engine import distribution
from gpuenv.engine.distribution import DistributionClient
from gpuenv.errors import PullError
from tests.integration.conftest import GPUENV, REPO

from ..jsonschemas import validate_output

pytestmark = pytest.mark.integration

DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MANIFEST_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
NEWER = "nvcr.io/nvidia/pytorch:26.11-py3"
INDEXED = "nvcr.io/nvidia/pytorch:25.10-py3"


def _call(
    registry: str, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[Any, bytes]:
    request = urllib.request.Request(
        f"http://{registry}{path}", data=body or None, method=method, headers=headers or {}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.headers, response.read()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _put_manifest(registry: str, reference: str, media_type: str, document: dict[str, Any]) -> str:
    body = json.dumps(document).encode()
    _call(
        registry,
        "PUT",
        f"/v2/nvidia/pytorch/manifests/{reference}",
        body,
        {"Content-Type": media_type},
    )
    return _digest(body)


@pytest.fixture(scope="module")
def multi_platform(registry: str) -> str:
    """25.10-py3 as NVIDIA publishes it: an index of linux/amd64 and linux/arm64. The
    arm64 variant is the amd64 stand-in relabelled (its config's architecture edited,
    the same layers); the index is PUT through the registry API."""
    tags = os.environ.get("GPUENV_TEST_SYNC_STANDIN_TAGS", "")
    assert "25.10-py3" in tags and "26.11-py3" in tags, (
        f"scripts/services.sh did not push the sync stand-ins (GPUENV_TEST_SYNC_STANDIN_TAGS={tags!r})"
    )
    accept = {"Accept": f"{MANIFEST_LIST}, {DOCKER_MANIFEST}"}
    _, body = _call(registry, "GET", "/v2/nvidia/pytorch/manifests/25.10-py3", headers=accept)
    document = json.loads(body)
    if document.get("mediaType") == MANIFEST_LIST:  # made by an earlier run: start again
        amd64 = next(m for m in document["manifests"] if m["platform"]["architecture"] == "amd64")
        _, body = _call(
            registry,
            "GET",
            f"/v2/nvidia/pytorch/manifests/{amd64['digest']}",
            headers={"Accept": DOCKER_MANIFEST},
        )
        document = json.loads(body)
    amd64_body = json.dumps(document).encode()
    amd64_digest = _put_manifest(registry, _digest(amd64_body), DOCKER_MANIFEST, document)
    _, config = _call(registry, "GET", f"/v2/nvidia/pytorch/blobs/{document['config']['digest']}")
    relabelled = json.loads(config)
    relabelled.update(architecture="arm64", variant="v8")
    arm_config = json.dumps(relabelled).encode()
    headers, _ = _call(registry, "POST", "/v2/nvidia/pytorch/blobs/uploads/")
    location = headers["Location"]
    location = location.split(registry, 1)[-1] if "://" in location else location
    separator = "&" if "?" in location else "?"
    _call(
        registry,
        "PUT",
        f"{location}{separator}digest={_digest(arm_config)}",
        arm_config,
        {"Content-Type": "application/octet-stream"},
    )
    arm = dict(document, config=dict(document["config"], digest=_digest(arm_config)))
    arm["config"]["size"] = len(arm_config)
    arm_digest = _put_manifest(registry, _digest(json.dumps(arm).encode()), DOCKER_MANIFEST, arm)
    index = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_LIST,
        "manifests": [
            {
                "mediaType": DOCKER_MANIFEST,
                "digest": digest,
                "size": size,
                "platform": platform,
            }
            for digest, size, platform in (
                (amd64_digest, len(amd64_body), {"os": "linux", "architecture": "amd64"}),
                (
                    arm_digest,
                    len(json.dumps(arm).encode()),
                    {"os": "linux", "architecture": "arm64", "variant": "v8"},
                ),
            )
        ],
    }
    return _put_manifest(registry, "25.10-py3", MANIFEST_LIST, index)


def _gpuenv(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GPUENV, *args], capture_output=True, text=True, env=env, cwd=env["HOME"], timeout=300
    )


@pytest.fixture
def user_env(tmp_path: Path, registry: str) -> dict[str, str]:
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "GPUENV_DATA_DIR": str(tmp_path / "data"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "GPUENV_REGISTRY_MIRROR": registry,
        "PYTHONPATH": str(REPO),
    }
    env.pop("GPUENV_MATRIX_DIR", None)
    env.pop("NGC_API_KEY", None)
    return env


def test_sync_adds_the_newer_tag_and_resolve_picks_it(
    user_env: dict[str, str], multi_platform: str
) -> None:
    done = _gpuenv(user_env, "matrix", "sync", "pytorch", "--json")
    assert done.returncode == 0, done.stderr
    report = validate_output("matrix-sync", done.stdout)
    assert NEWER in report["added"]
    assert "[1/" in done.stderr  # progress goes to stderr, the object alone to stdout
    text = Path(report["overlay"]).read_text()
    assert f"digest: {multi_platform}" in text
    assert "- linux/amd64\n  - linux/arm64" in text
    assert "cudnn: 9.14.0.64" in text

    resolved = _gpuenv(
        user_env,
        "resolve",
        "--framework",
        "pytorch",
        "--driver",
        "616.00",
        "--gpu",
        "H100",
        "--json",
    )
    assert resolved.returncode == 0, resolved.stderr
    chosen = validate_output("resolve", resolved.stdout)
    assert (chosen["image"], chosen["evidence"]) == (NEWER, "image")

    shown = _gpuenv(
        user_env, "resolve", "--framework", "pytorch", "--driver", "616.00", "--gpu", "H100"
    )
    assert (
        "evidence: image: read from the image itself (matrix row image nvcr.io/nvidia/pytorch@sha256:"
        in shown.stderr
    )
    rows = validate_output("matrix", _gpuenv(user_env, "matrix", "pytorch", "--json").stdout)
    by_tag = {row["tag"]: row for row in rows}
    assert by_tag["26.11-py3"]["origin"] == "image"
    assert by_tag["25.10-py3"]["origin"] == "shipped + image"
    assert by_tag["25.10-py3"]["platforms"] == ["linux/amd64", "linux/arm64"]
    assert by_tag["25.10-py3"]["source"].endswith(f"image nvcr.io/nvidia/pytorch@{multi_platform}")
    assert "image rows:" in _gpuenv(user_env, "matrix").stdout
    assert _gpuenv(user_env, "check").returncode != 6  # shipped + overlay validate

    again = validate_output(
        "matrix-sync", _gpuenv(user_env, "matrix", "sync", "pytorch", "--json").stdout
    )
    # Read again: only the images without NGC metadata (the run tests' stand-ins, and
    # any other plain image pushed there, e.g. by `make demo`).
    plain = [s for s in again["skipped"] if s.endswith("no NGC metadata in its config")]
    assert again["unchanged"] == 2 and again["read"] == len(plain) >= 3


def test_tags_are_read_page_by_page(registry: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(distribution, "PAGE", 1)
    tags = DistributionClient(registry).tags("nvidia/pytorch")
    assert {"24.05-py3", "25.10-py3", "26.11-py3"} <= set(tags)
    assert len(tags) == len(set(tags))


@pytest.fixture
def token_registry(registry: str) -> Iterator[str]:
    """A registry front that wants a bearer token from its own realm, issued for NGC's
    `$oauthtoken` login only, as nvcr.io does; authorized requests go to the registry."""

    class Front(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            host = f"127.0.0.1:{self.server.server_address[1]}"
            if self.path.startswith("/token"):
                login = base64.b64encode(b"$oauthtoken:nvapi-test").decode()
                ok = self.headers.get("Authorization") == f"Basic {login}"
                self._reply(
                    200 if ok else 401, json.dumps({"token": "t0k"}).encode() if ok else b""
                )
                return
            if self.headers.get("Authorization") != "Bearer t0k":
                self.send_response(401)
                realm = f'Bearer realm="http://{host}/token",service="{host}"'
                self.send_header(
                    "WWW-Authenticate", realm + ',scope="repository:nvidia/pytorch:pull"'
                )
                self.end_headers()
                return
            request = urllib.request.Request(
                f"http://{registry}{self.path}", headers={"Accept": self.headers.get("Accept", "")}
            )
            with urllib.request.urlopen(request, timeout=10) as response:
                headers = {
                    k: response.headers[k] for k in ("Content-Type", "Docker-Content-Digest")
                }
                self._reply(200, response.read(), headers)

        def _reply(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for name, value in (headers or {}).items():
                if value:
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Front)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_token_auth_as_for_nvcr_io(token_registry: str, multi_platform: str) -> None:
    login = {"username": "$oauthtoken", "password": "nvapi-test"}
    client = DistributionClient(token_registry, login)
    manifest = client.manifest("nvidia/pytorch", "25.10-py3")
    assert (manifest.media_type, manifest.digest) == (MANIFEST_LIST, multi_platform)
    with pytest.raises(Exception, match="refused a token"):
        DistributionClient(token_registry).tags("nvidia/pytorch")


@contextlib.contextmanager
def failing_front(registry: str, failures: int) -> Iterator[tuple[str, list[int]]]:
    """The test registry behind a front that fails on purpose (issue 33, item 6): each
    path's first `failures` requests get 503, 429 with `Retry-After: 1`, 502, … in turn;
    the next ones go to the registry. Yields its address and the statuses it sent."""
    seen: dict[str, int] = {}
    sent: list[int] = []
    lock = threading.Lock()

    class Front(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            with lock:
                count = seen[self.path] = seen.get(self.path, 0) + 1
            if count <= failures:
                status = (503, 429, 502)[(count - 1) % 3]
                sent.append(status)
                self.send_response(status)
                if status == 429:
                    self.send_header("Retry-After", "1")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            request = urllib.request.Request(
                f"http://{registry}{self.path}", headers={"Accept": self.headers.get("Accept", "")}
            )
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    status, body, headers = response.status, response.read(), response.headers
            except urllib.error.HTTPError as error:
                status, body, headers = error.code, error.read(), error.headers
            sent.append(status)
            self.send_response(status)
            for name in ("Content-Type", "Docker-Content-Digest", "Link"):
                if headers.get(name):
                    self.send_header(name, headers[name])
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Front)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", sent
    finally:
        server.shutdown()
        server.server_close()


def test_a_busy_registry_is_asked_again(
    registry: str, multi_platform: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """429 and 5xx are retried with backoff, honouring Retry-After: a registry that fails
    each request twice before answering still gives its manifests and tags."""
    monkeypatch.setattr(distribution, "BACKOFF", 0.05)
    with failing_front(registry, failures=2) as (front, sent):
        client = DistributionClient(front)
        started = time.monotonic()
        manifest = client.manifest("nvidia/pytorch", "25.10-py3")
        assert manifest.digest == multi_platform
        assert {"24.05-py3", "25.10-py3"} <= set(client.tags("nvidia/pytorch"))
        assert time.monotonic() - started >= 1  # the 429's Retry-After: 1 was waited
    assert sent.count(503) == 2 and sent.count(429) == 2 and 200 in sent


def test_a_registry_that_keeps_failing_is_named_after_bounded_retries(
    registry: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(distribution, "BACKOFF", 0.01)
    monkeypatch.setattr(distribution, "MAX_RETRY_AFTER", 0.1)
    with (
        failing_front(registry, failures=100) as (front, sent),
        pytest.raises(PullError, match=r"still after 5 retries") as failed,
    ):
        DistributionClient(front).tags("nvidia/pytorch")
    assert len(sent) == 6  # the request and its 5 retries, no more
    assert failed.value.hint == "the registry is busy or failing: try again later"


def test_matrix_sync_through_a_busy_registry(user_env: dict[str, str], multi_platform: str) -> None:
    """The whole command, as a user runs it, through a registry that fails once a path."""
    with failing_front(user_env["GPUENV_REGISTRY_MIRROR"], failures=1) as (front, sent):
        done = _gpuenv({**user_env, "GPUENV_REGISTRY_MIRROR": front}, "matrix", "sync", "pytorch")
    assert done.returncode == 0, done.stderr
    assert 503 in sent
