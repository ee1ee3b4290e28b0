"""`gpuenv notebook`: a run whose command is JupyterLab, on a loopback port, with a token
of its own.

The token reaches Jupyter as JUPYTER_TOKEN in the container's environment (never on its
command line, which the run's labels and `ps` show); gpuenv prints it once, in the URL
to open. The container listens on every interface of its own network (the engine's
port forwarding needs that), and the host side is 127.0.0.1 only.
"""

from __future__ import annotations

import secrets
from collections.abc import MutableMapping
from typing import Any

NOTEBOOK_PORT = 8888
TOKEN_ENV = "JUPYTER_TOKEN"
MODULE = "jupyterlab"
COMMAND = (
    "python3",
    "-m",
    "jupyterlab",
    "--no-browser",
    "--ip=0.0.0.0",
    f"--port={NOTEBOOK_PORT}",
    "--ServerApp.root_dir=/workspace",
)


def notebook_options(
    options: dict[str, Any], port: int, environ: MutableMapping[str, str], uid: int
) -> dict[str, Any]:
    """`gpuenv run`'s options for a notebook: its command, its port published on
    127.0.0.1:`port` (0: a free one), a new token passed through `environ`. As root
    (`uid` 0, or --root) Jupyter must be told it may run as root."""
    token = secrets.token_urlsafe(24)
    environ[TOKEN_ENV] = token
    as_root = uid == 0 or bool(options.get("root"))
    return {
        **options,
        "arguments": (*COMMAND, "--allow-root") if as_root else COMMAND,
        "env": (*options.get("env", ()), TOKEN_ENV),
        "publish": (*options.get("publish", ()), f"127.0.0.1:{port}:{NOTEBOOK_PORT}"),
        "url_paths": ((NOTEBOOK_PORT, f"lab?token={token}"),),
        "needs_module": MODULE,
        # No terminal: Ctrl-C then stops Jupyter at once (on a terminal it asks first).
        "interactive": False,
    }
