"""Ask an image a question before a run depends on the answer: whether its python3 can
import a module (`gpuenv notebook` needs jupyterlab). The probe's container has no
network, no GPU and no capabilities, mounts nothing and is always removed."""

from __future__ import annotations

import contextlib

from gpuenv.common.labels import PROBE_LABEL
from gpuenv.engine.protocol import ContainerEngine
from gpuenv.errors import GpuenvError


def can_import(engine: ContainerEngine, image: str, module: str) -> bool:
    """Whether `python3 -c 'import MODULE'` succeeds in `image` (the module's name is
    an argument of the program, never part of its code)."""
    config = {
        "Image": image,
        "Entrypoint": [],
        "Cmd": [
            "python3",
            "-c",
            "import importlib, sys; importlib.import_module(sys.argv[1])",
            module,
        ],
        "WorkingDir": "/",
        "Labels": {PROBE_LABEL: "1"},
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
        return engine.wait(container) == 0
    finally:
        with contextlib.suppress(GpuenvError):
            engine.remove(container)
