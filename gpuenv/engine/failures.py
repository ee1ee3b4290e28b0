"""What a failed pull or push means, in one message each, with the NGC key never shown
(daemon errors echo requests): shared by the adapters and the image service."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from gpuenv.errors import EngineRefused, PullError

NGC_KEY_ENV = "NGC_API_KEY"

# A registry's busy moment as the engine reports it (Docker: "toomanyrequests: …",
# "received unexpected HTTP status: 503 Service Unavailable"): worth asking again.
_TRANSIENT = re.compile(
    r"toomanyrequests|too many requests|\b(?:429|500|502|503|504)\b|service unavailable"
    r"|bad gateway|gateway time-?out|internal server error",
    re.IGNORECASE,
)


def transient(text: str) -> bool:
    """Whether a failed pull or push says the registry was busy or failing for a moment.

    >>> transient("toomanyrequests: You have reached your pull rate limit")
    True
    >>> transient("received unexpected HTTP status: 503 Service Unavailable")
    True
    >>> transient("manifest unknown"), transient("unauthorized: authentication required")
    (False, False)
    """
    return bool(_TRANSIENT.search(text))


def redact(text: str, env: Mapping[str, str] | None = None) -> str:
    """Remove the NGC key from text that may be shown (daemon errors echo requests)."""
    env = os.environ if env is None else env
    key = env.get(NGC_KEY_ENV)
    return text.replace(key, "***") if key and len(key) >= 4 else text


def pull_error(
    reference: str, explanation: str, status: int | None = None, verb: str = "pull"
) -> PullError:
    """One message per way a pull (or push) fails: unknown image, refused, unreachable."""
    text = redact(explanation)
    lowered = text.lower()
    refused = ("unauthorized", "denied", "authentication required", "forbidden", "no basic auth")
    if any(word in lowered for word in refused) or status in (401, 403):
        registry = reference.split("/", 1)[0]
        hint = (
            "set NGC_API_KEY to your NGC API key (https://ngc.nvidia.com/setup/api-key)"
            if registry == "nvcr.io"
            else f"log in first: `docker login {registry}`"
        )
        if "does not exist" in lowered or "not found" in lowered:
            return PullError(
                f"{reference} was not found, or {registry} refused access to it: {text}", hint=hint
            )
        return PullError(f"{registry} refused the {verb} of {reference}: {text}", hint=hint)
    if status == 404 or "not found" in lowered or "manifest unknown" in lowered:
        return PullError(
            f"{reference} does not exist in its registry: {text}",
            hint="check the tag (`gpuenv matrix`), or the mirror (GPUENV_REGISTRY_MIRROR)",
        )
    if any(
        word in lowered
        for word in (
            "no such host",
            "connection refused",
            "i/o timeout",
            "dial tcp",
            "timeout",
            "tls",
            "network is unreachable",
        )
    ):
        return PullError(
            f"cannot reach the registry for {reference}: {text}",
            hint="check the network, or pull through a mirror: GPUENV_REGISTRY_MIRROR=host:port",
        )
    return PullError(f"{verb}ing {reference} failed: {text}")


def removal_done(refusal: EngineRefused) -> bool:
    """Whether a refused container removal leaves it removed all the same: it is gone
    (404), or someone else's removal of it is under way (409, "removal of container …
    is already in progress": `docker rm -f`, another run's orphan check)."""
    return refusal.status == 404 or (
        refusal.status == 409 and "already in progress" in refusal.message
    )
