"""BuildKit's trace, decoded from answers captured from a real engine (tests/data/buildkit),
and the build progress it makes."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from gpuenv.images import buildkit
from gpuenv.images.progress import BuildProgress

DATA = Path(__file__).resolve().parents[1] / "data" / "buildkit"


def events(name: str) -> list[dict[str, object]]:
    loaded: list[dict[str, object]] = json.loads((DATA / name).read_text())
    return loaded


def fed(name: str) -> tuple[BuildProgress, list[str]]:
    progress, lines = BuildProgress(), []
    for event in events(name):
        lines += progress.feed(event)
    return progress, lines


def test_a_trace_message_decodes_to_vertexes_and_logs() -> None:
    statuses = [
        buildkit.decode(str(e["aux"]))
        for e in events("cache-mount.json")
        if e.get("id") == buildkit.TRACE_ID
    ]
    names = {v.name for s in statuses for v in s.vertexes}
    assert "[stage-0 3/3] RUN echo second" in names
    assert any(
        v.name.startswith("[stage-0 2/3] RUN --mount=type=cache")
        for s in statuses
        for v in s.vertexes
    )
    finished = [
        v for s in statuses for v in s.vertexes if v.completed is not None and v.started is not None
    ]
    assert finished and all(v.completed >= v.started > 1.7e9 for v in finished)  # 2023 and later
    logs = [log for s in statuses for log in s.logs]
    assert (1, b"second\n") in [(log.stream, log.data) for log in logs]
    assert all(log.vertex.startswith("sha256:") for log in logs)


def test_the_progress_of_a_build_with_a_cache_mount() -> None:
    progress, lines = fed("cache-mount.json")
    assert [s.name for s in progress.steps] == [
        "[stage-0 1/3] FROM docker.io/gpuenv-test/busybox:1",
        "[stage-0 2/3] RUN --mount=type=cache,target=/cache,id=t1 echo hello > /cache/x && ls /cache",
        "[stage-0 3/3] RUN echo second",
    ]
    assert [s.cached for s in progress.steps] == [True, False, False]
    assert all(s.seconds is not None and s.seconds >= 0 for s in progress.steps)
    assert lines == ["x", "second"]
    assert progress.error is None and progress.cached_steps == 1
    assert progress.steps[0].line().endswith(" · cached")
    assert progress.steps[2].line().startswith("[stage-0 3/3] RUN echo second · ")


def test_a_failing_step_is_named_with_its_own_last_lines() -> None:
    progress, lines = fed("failing-step.json")
    assert progress.step == (
        '[3/3] RUN echo "ERROR: No matching distribution found for nothing" >&2 && exit 1'
    )
    assert list(progress.tail) == ["ERROR: No matching distribution found for nothing"]
    assert progress.error is not None and progress.error.endswith("exit code: 1")
    # The step before it kept its own lines, stdout and stderr.
    assert list(progress.steps[1].tail) == ["first line", "to stderr"]
    assert "first line" in lines


def test_a_build_of_cached_steps_says_so() -> None:
    progress, lines = fed("all-cached.json")
    runs = [step for step in progress.steps if " RUN " in step.name]
    assert runs and all(step.cached for step in runs)
    assert progress.cached_steps == 1 and lines == []  # nothing ran, nothing to show


def test_a_log_line_split_across_messages_is_one_line() -> None:
    def message(*fields: bytes) -> dict[str, object]:
        return {"id": buildkit.TRACE_ID, "aux": base64.b64encode(b"".join(fields)).decode()}

    def length(number: int, payload: bytes) -> bytes:
        return bytes([number << 3 | 2, len(payload)]) + payload

    vertex = length(1, length(1, b"sha256:v") + length(3, b"[2/2] RUN x"))
    first = length(3, length(1, b"sha256:v") + bytes([3 << 3, 1]) + length(4, b"hal"))
    second = length(3, length(1, b"sha256:v") + bytes([3 << 3, 1]) + length(4, b"f\nwhole\n"))
    progress = BuildProgress()
    assert progress.feed(message(vertex, first)) == []
    assert progress.feed(message(second)) == ["half", "whole"]
    assert list(progress.tail) == ["half", "whole"]


@pytest.mark.parametrize(
    "aux",
    ["not base64!", base64.b64encode(b"\x0a\x05abc").decode(), base64.b64encode(b"\x0b").decode()],
    ids=["not-base64", "cut-short", "unknown-wire-type"],
)
def test_a_damaged_trace_is_a_trace_error(aux: str) -> None:
    with pytest.raises(buildkit.TraceError):
        buildkit.decode(aux)


def test_unknown_fields_are_skipped() -> None:
    vertex = b"\x0a\x03sha" + b"\x1a\x01n" + b"\x48\x01" + b"\x52\x02zz"  # fields 9, 10: new ones
    aux = base64.b64encode(bytes([0x0A, len(vertex)]) + vertex).decode()
    (decoded,) = buildkit.decode(aux).vertexes
    assert (decoded.digest, decoded.name) == ("sha", "n")
