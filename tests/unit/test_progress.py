from __future__ import annotations

import pytest

from gpuenv.images.progress import BuildProgress, BuildStep, PullProgress

DIGEST = "sha256:" + "0" * 64


def test_pull_progress_tracks_layers_and_totals() -> None:
    progress = PullProgress()
    for event in [
        {"status": "Pulling from nvidia/pytorch", "id": "24.05-py3"},
        {"status": "Pulling fs layer", "id": "a1"},
        {"status": "Pulling fs layer", "id": "b2"},
        {"status": "Downloading", "id": "a1", "progressDetail": {"current": 50, "total": 100}},
        {"status": "Downloading", "id": "b2", "progressDetail": {"current": 10, "total": 400}},
        {"status": "Download complete", "id": "a1"},
        {"status": "Pull complete", "id": "a1"},
        {"status": f"Digest: {DIGEST}"},
        {"status": "Status: Downloaded newer image for 127.0.0.1:5000/nvidia/pytorch:24.05-py3"},
    ]:
        progress.feed(event)
    assert set(progress.layers) == {"a1", "b2"}
    assert progress.downloaded == 110 and progress.total == 500
    assert progress.done_layers == 1
    assert progress.digest == DIGEST
    assert progress.status.startswith("Status: Downloaded newer image")
    assert progress.error is None


def test_pull_error_event() -> None:
    progress = PullProgress()
    progress.feed({"error": "manifest unknown", "errorDetail": {"message": "manifest unknown"}})
    assert progress.error == "manifest unknown"


def test_build_progress() -> None:
    progress = BuildProgress()
    events = [
        {"stream": "Step 1/3 : FROM base@sha256:x\n"},
        {"stream": " ---> 1234\n"},
        {"stream": 'Step 2/3 : COPY ["gpuenv/", "/usr/local/lib/gpuenv/"]\n'},
        {"stream": " ---> Using cache\n"},
        {"stream": 'Step 3/3 : RUN ["/bin/sh", "pip-install.sh"]\n'},
        {"stream": "Collecting numpy\n"},
        {"stream": "ERROR: No matching distribution found for nothing\n"},
        {"error": "The command returned a non-zero code: 1", "errorDetail": {"code": 1}},
    ]
    seen = []
    for event in events:
        seen += progress.feed(event)
    assert progress.step == 'Step 3/3 : RUN ["/bin/sh", "pip-install.sh"]'
    assert progress.cached_steps == 1
    assert list(progress.tail)[:2] == [
        "Collecting numpy",
        "ERROR: No matching distribution found for nothing",
    ]
    assert progress.error == "The command returned a non-zero code: 1"
    assert "Collecting numpy" in seen


def test_buildah_steps_their_cache_and_time() -> None:
    """Podman's builder (buildah), as its compatible /build streams it."""
    times = iter([10.0, 10.0, 12.5, 12.5, 20.0])
    progress = BuildProgress(clock=lambda: next(times))
    lines = [
        '[1/2] STEP 2/4: COPY ["gpuenv/install-uv.sh", "/usr/local/lib/gpuenv/install-uv.sh"]\n',
        "--> Using cache ed83ec29431cb1bde3f4c4a6604228fbf4442e12e84ebc3deec6bd4cfa805c2c\n",
        "--> ed83ec29431\n",
        '[2/2] STEP 4/6: RUN --mount=type=cache,id=gpuenv-python-0,target=/root/.cache ["/bin/sh"]\n',
        "gpuenv: installing with uv 0.13.9 (x86_64-unknown-linux-gnu)\n",
        "STEP 5/5: WORKDIR /workspace\n",
    ]
    for line in lines:
        progress.feed({"stream": line})
    progress.finish()
    assert [step.name.split(":")[0] for step in progress.steps] == [
        "[1/2] STEP 2/4",
        "[2/2] STEP 4/6",
        "STEP 5/5",
    ]
    first, install, last = progress.steps
    assert first.cached and first.line().endswith("· cached")
    assert install.seconds == 2.5 and install.line().endswith("· 2.5s")
    assert list(install.tail) == ["gpuenv: installing with uv 0.13.9 (x86_64-unknown-linux-gnu)"]
    assert last.seconds == 7.5


def test_an_unreadable_trace_message_loses_lines_not_the_build() -> None:
    progress = BuildProgress()
    assert progress.feed({"id": "moby.buildkit.trace", "aux": "not base64!"}) == []
    assert progress.feed({"id": "moby.buildkit.trace", "aux": "Cgo="}) == []  # cut short
    assert progress.error is None
    (warning,) = progress.warnings  # said once
    assert warning.startswith("BuildKit sent progress gpuenv cannot read")


@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("[stage-0 3/5] COPY [requirements/, /tmp/gpuenv/requirements/]", "[stage-0 3/5]"),
        ("Step 2/7 : RUN apt-get update", "Step 2/7"),
        ('[2/2] STEP 4/6: RUN ["/bin/sh"]', "[2/2] STEP 4/6"),
        ("STEP 5/5: WORKDIR /workspace", "STEP 5/5"),
    ],
)
def test_a_steps_label_is_its_number_as_the_builder_writes_it(name: str, label: str) -> None:
    assert BuildStep(name).label == label
