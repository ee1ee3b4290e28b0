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


def _registry(reference: str) -> str:
    """The registry host of a reference, as Docker reads it (``docker.io`` by default)."""
    first, _, rest = reference.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def pull_error(
    reference: str, explanation: str, status: int | None = None, verb: str = "pull"
) -> PullError:
    """One message per way a pull (or push) fails: unknown image, refused, unreachable;
    each with the fix for that case (the registry it is, by tag or by digest)."""
    text = redact(explanation)
    lowered = text.lower()
    registry = _registry(reference)
    refused = ("unauthorized", "denied", "authentication required", "forbidden", "no basic auth")
    if any(word in lowered for word in refused) or status in (401, 403):
        login = (
            "set NGC_API_KEY to your NGC API key (https://ngc.nvidia.com/setup/api-key)"
            if registry == "nvcr.io"
            else f"log in first: `docker login {registry}`"
        )
        if "does not exist" in lowered or "not found" in lowered:
            return PullError(
                f"{reference} was not found, or {registry} refused access to it: {text}",
                hint=f"check the image's name; if it is private, {login}",
            )
        return PullError(f"{registry} refused the {verb} of {reference}: {text}", hint=login)
    if status == 404 or "not found" in lowered or "manifest unknown" in lowered:
        return PullError(
            f"{reference} does not exist in its registry: {text}",
            hint=_missing(reference, registry, verb),
        )
    if any(word in lowered for word in ("x509", "certificate")):
        return PullError(
            f"the engine does not trust {registry}'s certificate ({reference}): {text}",
            hint=f"give the engine its CA: /etc/docker/certs.d/{registry}/ca.crt (Docker), "
            f"or /etc/containers/certs.d/{registry}/ca.crt (Podman)",
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
        hint = (
            "pull through a mirror your network reaches: GPUENV_REGISTRY_MIRROR=host:port"
            if registry == "nvcr.io"
            else f"start {registry}, or fix the engine host's route to it (DNS, proxy, "
            "firewall); for an nvcr.io mirror, fix or unset GPUENV_REGISTRY_MIRROR"
        )
        return PullError(f"cannot reach the registry for {reference}: {text}", hint=hint)
    return PullError(f"{verb}ing {reference} failed: {text}")


def _missing(reference: str, registry: str, verb: str) -> str:
    """The fix for an image the registry does not have."""
    if verb == "push":
        return f"push to a repository {registry} accepts (create it there first if it must)"
    if "@sha256:" in reference:
        return (
            "the registry no longer serves the digest gpuenv.lock pins: `gpuenv lock "
            "--upgrade` pins what it serves now (or restore the image)"
        )
    if registry == "nvcr.io":
        return "pick a tag `gpuenv matrix` lists, then `gpuenv lock --upgrade`"
    return (
        f"if {registry} is your nvcr.io mirror, copy the image there (or unset "
        "GPUENV_REGISTRY_MIRROR); else fix the name or tag (`base:` in gpuenv.yaml)"
    )


def removal_done(refusal: EngineRefused) -> bool:
    """Whether a refused container removal leaves it removed all the same: it is gone
    (404), or someone else's removal of it is under way (409, "removal of container …
    is already in progress": `docker rm -f`, another run's orphan check)."""
    return refusal.status == 404 or (
        refusal.status == 409 and "already in progress" in refusal.message
    )
