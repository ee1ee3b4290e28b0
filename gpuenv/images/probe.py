"""Ask an image a question in a short-lived container: what `gpuenv lock` reads of a base
of the team's own, whether `gpuenv notebook`'s image can import jupyterlab. The container
has no network, no GPU and no capabilities, mounts nothing and is always removed."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from gpuenv.common.labels import PROBE_LABEL
from gpuenv.engine.protocol import ContainerEngine
from gpuenv.errors import GpuenvError


def ask(
    engine: ContainerEngine, image: str, argv: Sequence[str], env: Sequence[str] = ()
) -> tuple[int, str]:
    """Run `argv` (as the entrypoint) in `image`: its exit code and its output."""
    config = {
        "Image": image,
        "Entrypoint": list(argv),
        "Cmd": [],
        "WorkingDir": "/",
        "Labels": {PROBE_LABEL: "1"},
        "Env": ["PYTHONDONTWRITEBYTECODE=1", *env],
        "NetworkDisabled": True,
        "HostConfig": {
            "NetworkMode": "none",
            "CapDrop": ["ALL"],
            "SecurityOpt": ["no-new-privileges"],
        },
    }
    container = engine.create(config)
    try:
        engine.start(container)
        output = b"".join(data for _, data in engine.logs(container, follow=True))
        return engine.wait(container), output.decode("utf-8", "replace")
    finally:
        with contextlib.suppress(GpuenvError):
            engine.remove(container)


def can_import(engine: ContainerEngine, image: str, module: str) -> bool:
    """Whether `python3 -c 'import MODULE'` succeeds in `image` (the module's name is
    an argument of the program, never part of its code)."""
    code = "import importlib, sys; importlib.import_module(sys.argv[1])"
    status, _ = ask(engine, image, ["python3", "-c", code, module])
    return status == 0
