"""Resolve the overlay inside the pinned base: a short-lived container of the base image
runs install.py --resolve (pip's `install --dry-run --report`, against the packages the
image has and its pip constraint files) and hands back the report. Nothing is installed,
nothing committed; the container is removed whatever happens.

It runs as the image's default user with no mounts, on the network builds use
(GPUENV_BUILD_NETWORK), since it reaches the same indexes a build step would.
"""

from __future__ import annotations

import contextlib
import io
import json
import tarfile
from collections.abc import Callable, Mapping
from typing import Any

from gpuenv.common import nesting
from gpuenv.common.labels import LABEL_PREFIX
from gpuenv.engine.failures import redact
from gpuenv.engine.protocol import Engine
from gpuenv.errors import GpuenvError, ResolutionError
from gpuenv.images.render import support_files

RESOLVER_LABEL = f"{LABEL_PREFIX}.resolver"
FOLDER = "/tmp/gpuenv-resolve"
REPORT = f"{FOLDER}/report.json"
CONFLICT = "gpuenv: conflict: "
FAILED = "gpuenv: failed: "
UNRESOLVABLE = "gpuenv: unresolvable: "  # no set of versions fits: fewer may be kept


class OverlayUnresolvable(ResolutionError):
    """pip found no set of versions for the requirements (or an index lacks one): a
    re-resolve may try again with fewer of the lock's versions kept."""


def _archive(files: Mapping[str, str]) -> bytes:
    """gpuenv-resolve/: the support files (install.py) and the requirement files."""
    members = [(f"gpuenv/{f.name.split('/', 1)[1]}", f.content()) for f in support_files()]
    members += [(f"requirements/{name}", text.encode()) for name, text in files.items()]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for folder in ("gpuenv-resolve", "gpuenv-resolve/gpuenv", "gpuenv-resolve/requirements"):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o777
            archive.addfile(info)
        for name, data in members:
            info = tarfile.TarInfo(f"gpuenv-resolve/{name}")
            info.size, info.mode = len(data), 0o666
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def run_resolver(
    engine: Engine,
    image: str,
    files: Mapping[str, str],
    *,
    network: str | None,
    on_line: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """The report of install.py --resolve run in `image` (present in the engine);
    ResolutionError (exit 4) naming what cannot be resolved (a conflict with the image,
    a requirement no index has)."""
    config: dict[str, Any] = {
        "Image": image,
        "Entrypoint": [],
        "Cmd": [
            "python3",
            f"{FOLDER}/gpuenv/install.py",
            f"{FOLDER}/requirements",
            "--resolve",
            REPORT,
        ],
        "WorkingDir": "/",
        "Labels": {RESOLVER_LABEL: "1"},
        "Env": ["PYTHONDONTWRITEBYTECODE=1"],
        "HostConfig": {"NetworkMode": network} if network else {},
    }
    container = engine.create(config)
    tail: list[str] = []
    try:
        engine.put_archive(container, "/tmp", _archive(files))
        engine.start(container)
        pending = ""
        for _, data in engine.logs(container, follow=True):
            pending += data.decode("utf-8", "replace")
            *done, pending = pending.split("\n")
            for line in done:
                tail = [*tail, line][-60:]
                on_line(redact(line))
        if pending:
            tail.append(pending)
            on_line(redact(pending))
        status = engine.wait(container)
        if status:
            raise _failure(status, tail)
        return _report(engine.get_archive(container, REPORT))
    finally:
        with contextlib.suppress(GpuenvError):
            engine.remove(container)


def _report(archive: bytes | None) -> dict[str, Any]:
    if archive is None:
        raise ResolutionError("the resolver wrote no report (the base image removed it?)")
    try:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            member = next((m for m in tar.getmembers() if m.isfile()), None)
            handle = tar.extractfile(member) if member is not None else None
            data = (
                nesting.loads(json.loads, handle.read().decode("utf-8"))
                if handle is not None
                else None
            )
    except (tarfile.TarError, UnicodeDecodeError, ValueError) as exc:
        raise ResolutionError(f"the resolver's report cannot be read ({exc})") from None
    if not isinstance(data, dict):
        raise ResolutionError("the resolver's report is not a JSON object")
    return data


def _failure(status: int, tail: list[str]) -> ResolutionError:
    conflicts = [line.removeprefix(CONFLICT) for line in tail if line.startswith(CONFLICT)]
    if conflicts:
        return ResolutionError(
            "the project's requirements conflict with the image: "
            + "; ".join(redact(line) for line in conflicts),
            hint="relax those pins (or remove them: the image provides the package), or pin "
            "an image that ships what they ask for (`version:` in gpuenv.yaml)",
        )
    for prefix, kind in ((UNRESOLVABLE, OverlayUnresolvable), (FAILED, ResolutionError)):
        said = [line.removeprefix(prefix) for line in tail if line.startswith(prefix)]
        if said:
            return kind(
                f"a requirement could not be resolved: {redact(said[-1])}",
                hint="fix that requirement (its name, its version, its index), then run "
                "`gpuenv lock` again",
            )
    if any("No module named pip" in line for line in tail):
        return ResolutionError(
            "the base image has no pip, so gpuenv cannot resolve Python requirements on it",
            hint="choose a framework image (framework: pytorch, tensorflow or jax)",
        )
    shown = "\n".join(redact(line) for line in tail[-15:])
    return ResolutionError(f"resolving the Python requirements failed (exit {status}):\n{shown}")
