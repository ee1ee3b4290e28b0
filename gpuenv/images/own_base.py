"""Read a base image of the team's own (`base:` naming an image): pull it, read its
configuration, and run the probe in it (`gpuenv.matrix.own`). The probe's container has
no network, drops every capability, mounts nothing and is removed whatever happens.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuenv.engine.protocol import Engine
from gpuenv.errors import PullError
from gpuenv.images.probe import ask
from gpuenv.images.progress import PullView
from gpuenv.images.registry import credentials, parse_reference
from gpuenv.images.service import consume_pull, with_retries
from gpuenv.matrix.own import (
    PROBE,
    PROBE_MODULES,
    Reading,
    combined,
    from_config,
    from_probe,
    probe_answer,
)

# The image's own Python runs the probe (python3, else python), for at most two minutes
# where the image has `timeout`; no Python is said, not failed.
_RUN_PROBE = (
    'T=""; command -v timeout >/dev/null 2>&1 && T="timeout 120"; '
    "for p in python3 python; do "
    'if command -v "$p" >/dev/null 2>&1; then exec $T "$p" -c "$1" "$2"; fi; done; '
    'echo "GPUENV-PROBE {\\"error\\": \\"the image has no python3 or python\\"}"'
)


@dataclass(frozen=True)
class OwnBase:
    """What was read of the image: its registry digest and the reading."""

    digest: str
    reading: Reading


def read_own_base(engine: Engine, reference: str, framework: str, view: PullView) -> OwnBase:
    """Pull `reference` (a tag, or a digest), then read it; PullError when the registry
    does not have it or gives no digest to pin."""
    parsed = parse_reference(reference)
    repository = parsed.repository
    auth = credentials(repository)
    wanted = parsed.digest or parsed.tag or "latest"
    local = f"{repository}@{wanted}" if parsed.digest else f"{repository}:{wanted}"
    try:
        progress = with_retries(
            lambda: consume_pull(engine.pull(repository, wanted, auth), local, view),
            f"pull of {local}",
        )
    except PullError as exc:
        if "does not exist" not in exc.message and "was not found" not in exc.message:
            raise  # refused, unreachable, untrusted: their own fix
        raise PullError(
            exc.message,
            hint=f"fix `base:` in gpuenv.yaml (registry/path:tag); if {parsed.registry} "
            f"keeps it private, `docker login {parsed.registry}` first",
        ) from None
    digest = parsed.digest or progress.digest
    if not digest:
        found = [d for d in engine.repo_digests(local) if d.startswith(f"{repository}@")]
        digest = found[0].split("@", 1)[1] if found else None
    if not digest:
        raise PullError(
            f"{local} has no registry digest after the pull",
            hint="push the image to a registry your team reaches; gpuenv.lock pins it by digest",
        )
    pinned = f"{repository}@{digest}"
    config = from_config(framework, engine.image_config(pinned))
    probe = from_probe(framework, _probe(engine, pinned, PROBE_MODULES.get(framework, "")))
    return OwnBase(digest, combined(config, probe))


def _probe(engine: Engine, image: str, module: str) -> dict[str, object] | None:
    argv = ["/bin/sh", "-c", _RUN_PROBE, "gpuenv-probe", PROBE, module]
    _, output = ask(engine, image, argv, env=["TF_CPP_MIN_LOG_LEVEL=3"])
    answer = probe_answer(output)
    return dict(answer) if answer is not None else None
