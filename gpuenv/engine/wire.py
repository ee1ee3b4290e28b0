"""The engine API's wire: HTTP/1.1 over a Unix socket, one request per connection
(`Connection: close`), as the engine speaks it, with the standard library's socket
only (http.client and urllib.parse, with email and ssl behind them, cost a run ~45 ms
of imports); percent-encoding as urllib.parse does it (a test holds them together)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator, Mapping
from typing import Any

# RFC 3986's unreserved characters: what urllib.parse.quote(..., safe="") leaves as is.
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")


def quote(text: str) -> str:
    """Percent-encode all but the unreserved characters, as `urllib.parse.quote(text,
    safe="")` does (a test holds them together), without urllib.parse's import (~5 ms,
    with ipaddress) on every run.

    >>> quote("127.0.0.1:5000/gpuenv/p:1")
    '127.0.0.1%3A5000%2Fgpuenv%2Fp%3A1'
    """
    return "".join(chr(b) if b in _UNRESERVED else f"%{b:02X}" for b in text.encode())


def urlencode(query: Mapping[str, Any]) -> str:
    """A query string, as `urllib.parse.urlencode(query, quote_via=quote)` makes it.

    >>> urlencode({"name": "a b", "force": 1})
    'name=a%20b&force=1'
    """
    return "&".join(f"{quote(str(k))}={quote(str(v))}" for k, v in query.items())


class BadResponse(OSError):
    """The engine's answer was not HTTP/1.1 as it speaks it (a dying engine, a wrong socket)."""


def read_head(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """The status and (lower-cased) headers of a response, and the bytes read past them."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise BadResponse("the engine closed the connection before answering")
        data += chunk
        if len(data) > 1 << 20:
            raise BadResponse("the engine's response headers never end")
    head, _, rest = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise BadResponse(f"not an HTTP response: {status_line[:80]!r}")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers, rest


def read_body(sock: socket.socket, headers: Mapping[str, str], data: bytes) -> bytes:
    """The whole body: chunked, by Content-Length, or up to the close."""
    return b"".join(body_chunks(sock, headers, data))


def body_chunks(sock: socket.socket, headers: Mapping[str, str], data: bytes) -> Iterator[bytes]:
    """The body as it comes (chunked, by Content-Length, or up to the close)."""

    def more() -> bytes:
        chunk = sock.recv(65536)
        if not chunk:
            raise BadResponse("the engine closed the connection mid-response")
        return chunk

    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            while b"\r\n" not in data:
                data += more()
            size_line, _, data = data.partition(b"\r\n")
            try:
                size = int(size_line.split(b";", 1)[0].strip() or b"x", 16)
            except ValueError:
                raise BadResponse(f"bad chunk size {size_line[:20]!r}") from None
            if size == 0:
                return  # trailers, if any, are not needed: the connection closes
            while len(data) < size + 2:
                data += more()
            yield data[:size]
            data = data[size + 2 :]
    if "content-length" in headers:
        try:
            length = int(headers["content-length"])
        except ValueError:
            raise BadResponse("bad Content-Length") from None
        while len(data) < length:
            data += more()
        yield data[:length]
        return
    if data:
        yield data
    while chunk := sock.recv(65536):
        yield chunk


def exchange(
    path: str,
    method: str,
    url: str,
    body: bytes | None,
    headers: Mapping[str, str],
    timeout: float | None,
) -> tuple[int, bytes]:
    """One request on a fresh connection to the socket at `path`: its status and body."""
    sock = send(path, method, url, body, headers, timeout)
    try:
        status, response_headers, rest = read_head(sock)
        if status in (204, 304) or 100 <= status < 200:
            return status, b""
        return status, read_body(sock, response_headers, rest)
    finally:
        sock.close()


def send(
    path: str,
    method: str,
    url: str,
    body: bytes | None,
    headers: Mapping[str, str],
    timeout: float | None,
) -> socket.socket:
    """A fresh connection to the socket at `path`, with the request sent on it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
        lines = [f"{method} {url} HTTP/1.1", "Host: docker", "Connection: close"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if body is not None or method in ("POST", "PUT"):
            lines.append(f"Content-Length: {len(body or b'')}")
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b""))
    except BaseException:
        sock.close()
        raise
    return sock


def message(status: int, data: bytes) -> str:
    try:
        message = json.loads(data).get("message", "")
    except (ValueError, AttributeError):
        message = data.decode(errors="replace")
    return str(message).strip() or f"HTTP {status}"
