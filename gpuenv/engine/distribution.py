"""A read-only client of the Distribution (OCI registry) API for `gpuenv matrix sync`:
tags (all pages), manifests and indexes, config blobs; never a layer.

Token auth as registries do it: a 401 names a realm (``WWW-Authenticate: Bearer
realm=...,service=...,scope=...``), the token comes from there (with NGC's API key as
``$oauthtoken`` for nvcr.io, as for pulls), and the request is made again. Loopback
registries speak plain HTTP, as Docker allows; every other one HTTPS.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from gpuenv.engine.protocol import Manifest, UnknownRepository
from gpuenv.errors import PullError

MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
MAX_BYTES = 16 << 20
PAGE = 1000
_LOOPBACK = re.compile(r"^(localhost|127\.\d+\.\d+\.\d+|\[::1\])(:\d+)?$")
_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')


class _SameHostAuth(urllib.request.HTTPRedirectHandler):
    """Follow redirects (blobs go to a CDN) without taking the credentials along."""

    def redirect_request(
        self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> Any:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if (
            new is not None
            and urllib.parse.urlsplit(newurl).netloc != urllib.parse.urlsplit(req.full_url).netloc
        ):
            new.remove_header("Authorization")
        return new


class DistributionClient:
    """The registry at `host` (``nvcr.io``, ``127.0.0.1:5000``); `credentials` as
    `images.registry.credentials` gives them (username, password), or None."""

    def __init__(
        self,
        host: str,
        credentials: dict[str, str] | None = None,
        *,
        scheme: str | None = None,
        timeout: float = 30,
    ) -> None:
        self.host = host
        self.base = f"{scheme or ('http' if _LOOPBACK.match(host) else 'https')}://{host}"
        self.credentials = credentials
        self.timeout = timeout
        self._tokens: dict[str, str] = {}
        self._opener = urllib.request.build_opener(_SameHostAuth)

    def tags(self, repository: str) -> list[str]:
        path: str | None = f"/v2/{repository}/tags/list?n={PAGE}"
        out: list[str] = []
        while path:
            status, headers, body = self._get(path, repository)
            if status == 404:
                raise UnknownRepository(f"{self.host} has no repository {repository}")
            self._check(status, body, f"the tags of {repository}")
            out.extend(str(tag) for tag in (_json(body).get("tags") or []))
            path = _next_page(headers.get("Link", ""))
        return out

    def manifest(self, repository: str, reference: str) -> Manifest:
        status, headers, body = self._get(
            f"/v2/{repository}/manifests/{reference}", repository, accept=", ".join(MANIFEST_TYPES)
        )
        self._check(status, body, f"the manifest of {repository}:{reference}")
        document = _json(body)
        media_type = str(document.get("mediaType") or headers.get("Content-Type", "")).split(";")[0]
        digest = (
            headers.get("Docker-Content-Digest") or "sha256:" + hashlib.sha256(body).hexdigest()
        )
        return Manifest(media_type, digest, document)

    def blob(self, repository: str, digest: str) -> dict[str, Any]:
        status, _, body = self._get(f"/v2/{repository}/blobs/{digest}", repository)
        self._check(status, body, f"the config {digest} of {repository}")
        if "sha256:" + hashlib.sha256(body).hexdigest() != digest:
            raise PullError(
                f"{self.host} sent a config of {repository} that does not match {digest}"
            )
        return _json(body)

    def _get(
        self, path: str, repository: str, *, accept: str | None = None
    ) -> tuple[int, Any, bytes]:
        scope = f"repository:{repository}:pull"
        for attempt in range(2):
            request = urllib.request.Request(self.base + path)
            if accept:
                request.add_header("Accept", accept)
            if scope in self._tokens:
                request.add_header("Authorization", self._tokens[scope])
            status, headers, body = self._send(request)
            if status != 401 or attempt:
                return status, headers, body
            self._tokens[scope] = self._authorize(headers.get("WWW-Authenticate", ""), scope)
        raise AssertionError("unreachable")

    def _send(self, request: urllib.request.Request) -> tuple[int, Any, bytes]:
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                return response.status, response.headers, response.read(MAX_BYTES)
        except urllib.error.HTTPError as error:
            with error:
                return error.code, error.headers, error.read(MAX_BYTES)
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise PullError(
                f"cannot reach the registry {self.host}: {reason}",
                hint="check --registry or GPUENV_REGISTRY_MIRROR, and the network",
            ) from None

    def _authorize(self, challenge: str, scope: str) -> str:
        scheme, _, params = challenge.partition(" ")
        basic = None
        if self.credentials:
            pair = f"{self.credentials['username']}:{self.credentials['password']}"
            basic = "Basic " + base64.b64encode(pair.encode()).decode()
        if scheme.lower() == "basic":
            if basic is None:
                raise self._refused("asks for a login")
            return basic
        fields = dict(_CHALLENGE.findall(params))
        if scheme.lower() != "bearer" or "realm" not in fields:
            raise self._refused(f"asks for an authentication gpuenv does not know ({scheme!r})")
        query = {"service": fields.get("service", ""), "scope": fields.get("scope", scope)}
        request = urllib.request.Request(
            fields["realm"] + "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v})
        )
        if basic:
            request.add_header("Authorization", basic)
        status, _, body = self._send(request)
        if status != 200:
            raise self._refused(f"refused a token ({status})")
        token = _json(body).get("token") or _json(body).get("access_token")
        if not token:
            raise self._refused("sent no token")
        return f"Bearer {token}"

    def _refused(self, what: str) -> PullError:
        hint = (
            "set NGC_API_KEY to your NGC API key"
            if self.host == "nvcr.io"
            else "log in to the registry, or use one that allows anonymous pulls"
        )
        return PullError(f"the registry {self.host} {what}", hint=hint)

    def _check(self, status: int, body: bytes, what: str) -> None:
        if status == 200:
            return
        errors = _json(body).get("errors") if body[:1] == b"{" else None
        detail = "; ".join(str(e.get("message", e)) for e in errors) if errors else f"HTTP {status}"
        if status == 401:
            raise self._refused(f"refused to send {what} ({detail})")
        raise PullError(f"{self.host} could not send {what}: {detail}")


def _json(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _next_page(link: str) -> str | None:
    """The next page of a paginated list, from its Link header.

    >>> _next_page('</v2/nvidia/pytorch/tags/list?last=24.05-py3&n=1000>; rel="next"')
    '/v2/nvidia/pytorch/tags/list?last=24.05-py3&n=1000'
    >>> _next_page("") is None
    True
    """
    match = re.search(r'<([^>]+)>\s*;\s*rel="?next"?', link)
    if not match:
        return None
    url = urllib.parse.urlsplit(match.group(1))
    return url.path + (f"?{url.query}" if url.query else "")
