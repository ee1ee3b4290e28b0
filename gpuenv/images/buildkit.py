"""BuildKit's progress, as the Engine API sends it during a build (`POST /build?version=2`):
messages `{"id": "moby.buildkit.trace", "aux": "<base64>"}` whose payload is BuildKit's
`StatusResponse` protobuf (moby/buildkit api/services/control/control.proto):

    StatusResponse { repeated Vertex vertexes = 1; repeated VertexStatus statuses = 2;
                     repeated VertexLog logs = 3; repeated VertexWarning warnings = 4; }
    Vertex         { string digest = 1; repeated string inputs = 2; string name = 3;
                     bool cached = 4; Timestamp started = 5; Timestamp completed = 6;
                     string error = 7; ... }
    VertexLog      { string vertex = 1; Timestamp timestamp = 2; int64 stream = 3;
                     bytes msg = 4; }
    Timestamp      { int64 seconds = 1; int32 nanos = 2; }

Only these fields are read, by a reader of the protobuf wire format's four field kinds
(varint, 64-bit, length-delimited, 32-bit): a vertex's name, whether it was cached, when
it started and completed, its error, and the logs' lines. Fields and messages gpuenv does
not know are skipped, as protobuf requires of a reader. The `protobuf` package with
BuildKit's generated classes would read the same, at the price of a dependency and of
vendoring control.proto and what it imports (gogoproto, the LLB ops).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator
from dataclasses import dataclass, field

TRACE_ID = "moby.buildkit.trace"

_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5


class TraceError(ValueError):
    """A trace message that is not BuildKit's StatusResponse as this reader knows it."""


@dataclass(frozen=True)
class Vertex:
    """One step of the build graph as BuildKit reports it (a message may repeat a vertex
    with more known: started, then completed)."""

    digest: str
    name: str = ""
    cached: bool = False
    started: float | None = None  # seconds since the epoch
    completed: float | None = None
    error: str = ""


@dataclass(frozen=True)
class Log:
    """Output of a vertex's process: stream 1 is stdout, 2 stderr."""

    vertex: str
    stream: int
    data: bytes


@dataclass(frozen=True)
class Status:
    vertexes: tuple[Vertex, ...] = ()
    logs: tuple[Log, ...] = field(default_factory=tuple)


def decode(aux: str) -> Status:
    """One trace message's `aux` (base64 of a StatusResponse) as a Status.

    >>> decode("").vertexes
    ()
    """
    try:
        raw = base64.b64decode(aux, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise TraceError(f"not base64: {exc}") from None
    vertexes, logs = [], []
    for number, value in _fields(raw):
        if number == 1 and isinstance(value, bytes):
            vertexes.append(_vertex(value))
        elif number == 3 and isinstance(value, bytes):
            logs.append(_log(value))
    return Status(tuple(vertexes), tuple(logs))


def _vertex(raw: bytes) -> Vertex:
    fields = _by_number(raw)
    return Vertex(
        digest=_text(fields.get(1)),
        name=_text(fields.get(3)),
        cached=bool(fields.get(4)),
        started=_timestamp(fields.get(5)),
        completed=_timestamp(fields.get(6)),
        error=_text(fields.get(7)),
    )


def _log(raw: bytes) -> Log:
    fields = _by_number(raw)
    stream = fields.get(3)
    data = fields.get(4)
    return Log(
        vertex=_text(fields.get(1)),
        stream=stream if isinstance(stream, int) else 1,
        data=data if isinstance(data, bytes) else b"",
    )


def _by_number(raw: bytes) -> dict[int, int | bytes]:
    """A message's fields by number (the last of a repeated one: none read here repeats)."""
    return dict(_fields(raw))


def _text(value: int | bytes | None) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else ""


def _timestamp(value: int | bytes | None) -> float | None:
    """A google.protobuf.Timestamp as seconds since the epoch."""
    if not isinstance(value, bytes):
        return None
    fields = _by_number(value)
    seconds, nanos = fields.get(1, 0), fields.get(2, 0)
    if not isinstance(seconds, int) or not isinstance(nanos, int):
        raise TraceError("a timestamp whose fields are not numbers")
    return seconds + nanos / 1e9


def _fields(raw: bytes) -> Iterator[tuple[int, int | bytes]]:
    """The (field number, value) pairs of one protobuf message: a varint as an int, a
    length-delimited field as its bytes, a fixed-size one as its raw bytes."""
    offset = 0
    while offset < len(raw):
        key, offset = _varint(raw, offset)
        number, kind = key >> 3, key & 7
        value: int | bytes
        if kind == _VARINT:
            value, offset = _varint(raw, offset)
        elif kind == _BYTES:
            size, offset = _varint(raw, offset)
            value, offset = raw[offset : offset + size], offset + size
        elif kind in (_FIXED64, _FIXED32):
            width = 8 if kind == _FIXED64 else 4
            value, offset = raw[offset : offset + width], offset + width
        else:
            raise TraceError(f"field {number} has wire type {kind}, which BuildKit does not send")
        if offset > len(raw):
            raise TraceError("a message cut short")
        yield number, value


def _varint(raw: bytes, offset: int) -> tuple[int, int]:
    """A base-128 varint at `offset`, and the offset after it."""
    result = shift = 0
    while True:
        if offset >= len(raw) or shift > 63:
            raise TraceError("a number cut short")
        byte = raw[offset]
        offset += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return result, offset
