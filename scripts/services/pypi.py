"""The package index of the test services (scripts/services/pypi.sh), in three commands:

    pypi.py index ROOT                  ROOT/simple/: a PEP 503 index of the wheels in ROOT/wheels
                                        (and PEP 691 JSON pages with PEP 700 upload times)
    pypi.py needs-torch-wheel WHEELS    WHEELS/gpuenv_needs_torch-1.0-py3-none-any.whl
    pypi.py serve ROOT SOCKET LOG       serves ROOT over HTTP on the unix SOCKET, one line a
                                        request in LOG

Standard library only: it runs with Debian's python3, outside any virtual environment.
"""

import base64
import datetime
import email.parser
import hashlib
import html
import http.server
import io
import json
import re
import socketserver
import sys
import threading
import zipfile
from pathlib import Path

# --- the index -------------------------------------------------------------------------


def normalized(name: str) -> str:
    """A project's name as PEP 503 spells it in URLs: runs of -_. as one -, lower case."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requires_python(wheel: Path) -> str | None:
    """The Requires-Python of a wheel's METADATA, if it has one."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
        metadata = email.parser.BytesHeaderParser().parsebytes(archive.read(name))
    return metadata.get("Requires-Python")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def page(title: str, links: list[str]) -> str:
    body = "\n".join(links)
    return (
        f"<!DOCTYPE html>\n<html>\n<head><title>{html.escape(title)}</title></head>\n"
        f"<body>\n<h1>{html.escape(title)}</h1>\n{body}\n</body>\n</html>\n"
    )


def wheel_link(wheel: Path) -> str:
    """A project page's link to WHEEL: its hash in the fragment (pip and uv check it), and
    its Requires-Python, which lets a resolver skip a release without downloading it."""
    href = f"../../wheels/{wheel.name}#sha256={sha256(wheel)}"
    python = requires_python(wheel)
    attribute = f' data-requires-python="{html.escape(python)}"' if python else ""
    return f'<a href="{html.escape(href)}"{attribute}>{html.escape(wheel.name)}</a><br>'


def write(path: Path, text: str) -> None:
    """Writes PATH whole or not at all: the server may be reading it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)


def json_page(project: str, wheels: list[Path]) -> str:
    """PEP 691's JSON form of a project page, with PEP 700's upload-time (the wheel's
    modification time): what pip's --uploaded-prior-to and uv's --exclude-newer read."""
    files = []
    for wheel in wheels:
        uploaded = datetime.datetime.fromtimestamp(wheel.stat().st_mtime, datetime.UTC)
        entry = {
            "filename": wheel.name,
            "url": f"../../wheels/{wheel.name}",
            "hashes": {"sha256": sha256(wheel)},
            "upload-time": uploaded.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        }
        python = requires_python(wheel)
        if python:
            entry["requires-python"] = python
        files.append(entry)
    meta = {"api-version": "1.1"}
    return json.dumps({"meta": meta, "name": project, "files": files}, indent=1)


def index(root: Path) -> None:
    projects: dict[str, list[Path]] = {}
    for wheel in sorted((root / "wheels").glob("*.whl")):
        # A wheel's file name starts with its project's name, '-' written as '_'.
        projects.setdefault(normalized(wheel.name.split("-")[0]), []).append(wheel)
    simple = root / "simple"
    for project, wheels in projects.items():
        write(simple / project / "index.json", json_page(project, wheels))
        write(simple / project / "index.html", page(project, [wheel_link(w) for w in wheels]))
    for stale in simple.glob("*/index.html"):
        if stale.parent.name not in projects:
            for name in ("index.html", "index.json"):
                (stale.parent / name).unlink(missing_ok=True)
            stale.parent.rmdir()
    # Written last: scripts/services/pypi.sh takes the index as current when this file is
    # newer than every wheel.
    links = [f'<a href="{project}/">{project}</a><br>' for project in projects]
    write(simple / "index.html", page("Simple index", links))


# --- gpuenv-needs-torch ----------------------------------------------------------------

NEEDS_TORCH = "gpuenv_needs_torch-1.0"
NEEDS_TORCH_MODULE = '''\
"""A package of gpuenv's tests that depends on torch: installing it must keep the
image's own torch."""

import torch

TORCH_VERSION = torch.__version__
'''
NEEDS_TORCH_METADATA = """\
Metadata-Version: 2.1
Name: gpuenv-needs-torch
Version: 1.0
Summary: A test package of gpuenv's that depends on torch
Requires-Dist: torch>=2.0
"""
NEEDS_TORCH_WHEEL = """\
Wheel-Version: 1.0
Generator: gpuenv scripts/services/pypi.py
Root-Is-Purelib: true
Tag: py3-none-any
"""
NEEDS_TORCH_FILES = {
    "gpuenv_needs_torch.py": NEEDS_TORCH_MODULE,
    f"{NEEDS_TORCH}.dist-info/METADATA": NEEDS_TORCH_METADATA,
    f"{NEEDS_TORCH}.dist-info/WHEEL": NEEDS_TORCH_WHEEL,
}


def record_line(name: str, data: bytes) -> str:
    """A RECORD line: the file's urlsafe base64 sha256 without padding, and its size."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}\n"


def needs_torch_wheel(wheels: Path) -> None:
    """Writes the wheel only when its bytes change (fixed dates: the same every time), so
    the index stays current."""
    files = {name: text.encode() for name, text in NEEDS_TORCH_FILES.items()}
    record = f"{NEEDS_TORCH}.dist-info/RECORD"
    lines = [record_line(name, data) for name, data in files.items()] + [f"{record},,\n"]
    files[record] = "".join(lines).encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():  # RECORD last, as the wheel format asks
            entry = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            entry.external_attr = 0o644 << 16  # rw-r--r--, as a file written by hand
            archive.writestr(entry, data)
    wheel = wheels / f"{NEEDS_TORCH}-py3-none-any.whl"
    if not wheel.exists() or wheel.read_bytes() != buffer.getvalue():
        partial = wheel.with_name(wheel.name + ".partial")
        partial.write_bytes(buffer.getvalue())
        partial.replace(wheel)


# --- the server ------------------------------------------------------------------------


JSON_TYPE = "application/vnd.pypi.simple.v1+json"


class Handler(http.server.SimpleHTTPRequestHandler):
    """Files under the server's root, and one line a request in the access log."""

    access_log: io.TextIOBase
    lock = threading.Lock()

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        # Every answer passes here (send_response), errors and redirects included.
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")
        # A request line that did not parse leaves no command, nor (too long) a path.
        command, path = self.command or "-", getattr(self, "path", "") or "-"
        line = f"{now} {command} {path} {int(code)}\n"
        with self.lock:
            self.access_log.write(line)

    def send_head(self):  # type: ignore[no-untyped-def]
        """A project page in PEP 691's JSON when the client asks for it (pip and uv do),
        else the HTML page."""
        accept = self.headers.get("Accept", "")
        if JSON_TYPE in accept and self.path.split("?")[0].endswith("/"):
            page_json = Path(self.translate_path(self.path)) / "index.json"
            if page_json.is_file():
                data = page_json.read_bytes()
                self.send_response(200)
                self.send_header("Content-Type", JSON_TYPE)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                return io.BytesIO(data)
        return super().send_head()

    def end_headers(self) -> None:
        # PyPI's own caching headers: files never change, index pages for 10 minutes.
        # pip keeps a download in its cache only when the answer says it may.
        if self.path.startswith("/wheels/"):
            self.send_header("Cache-Control", "max-age=365000000, immutable, public")
        elif self.path.startswith("/simple/"):
            self.send_header("Cache-Control", "max-age=600, public")
        super().end_headers()

    def address_string(self) -> str:
        # A unix socket's client has no address (client_address is '').
        return "local"


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def serve(root: Path, socket_path: str, log: Path) -> None:
    Handler.access_log = log.open("a", buffering=1)  # line-buffered: tests read it at once
    handler = lambda *args: Handler(*args, directory=str(root))  # noqa: E731
    with Server(socket_path, handler) as server:
        server.serve_forever()


def main(argv: list[str]) -> None:
    match argv:
        case ["index", root]:
            index(Path(root))
        case ["needs-torch-wheel", wheels]:
            needs_torch_wheel(Path(wheels))
        case ["serve", root, socket_path, log]:
            serve(Path(root), socket_path, Path(log))
        case _:
            sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
