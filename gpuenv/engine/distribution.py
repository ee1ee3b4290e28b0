"""A read-only client of the Distribution (OCI registry) API for `gpuenv matrix sync`:
tags (all pages), manifests and indexes, config blobs; never a layer.

Token auth as registries do it: a 401 names a realm (``WWW-Authenticate: Bearer
realm=...,service=...,scope=...``), the token comes from there (with NGC's API key as
``$oauthtoken`` for nvcr.io, as for pulls), and the request is made again. Loopback
registries speak plain HTTP, as Docker allows; every other one HTTPS.

A busy registry is asked again: 429 and 5xx answers and dropped connections are retried
with exponential backoff (0.5 s, 1 s, 2 s, … up to RETRIES times), honouring a
`Retry-After` of at most MAX_RETRY_AFTER seconds; urllib3's `Retry`, through requests
(both already installed with docker-py). Redirects to another host (blobs go to a CDN)
never take the credentials along (requests drops `Authorization` there).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import urllib.parse
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from gpuenv.common import nesting
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
RETRIES = 5
BACKOFF = 0.5  # seconds; doubled at each retry
MAX_RETRY_AFTER = 30.0  # a registry's Retry-After beyond this is waited this long


class _BoundedRetry(Retry):
    """urllib3's Retry, with the registry's Retry-After bounded: a `Retry-After: 3600`
    never stalls a command for an hour."""

    def get_retry_after(self, response: Any) -> float | None:
        value = super().get_retry_after(response)
        return None if value is None else min(value, MAX_RETRY_AFTER)


def retrying_session() -> requests.Session:
    """A requests session that retries GETs on 429, 5xx and dropped connections."""
    retry = _BoundedRetry(
        total=RETRIES,
        backoff_factor=BACKOFF,
        status_forcelist=(429, 500, 502, 503, 504),
        allowed_methods=frozenset({"GET", "HEAD"}),
        respect_retry_after_header=True,
        raise_on_status=False,  # the last answer is reported as the registry's
    )
    session = requests.Session()
    adapter = HTTPAdapter(max_retries=retry)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    session.trust_env = False  # no ~/.netrc credentials sent to a registry by accident
    return session


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
        self._session = retrying_session()

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
            headers = {"Accept": accept} if accept else {}
            if scope in self._tokens:
                headers["Authorization"] = self._tokens[scope]
            status, answer, body = self._send(self.base + path, headers)
            if status != 401 or attempt:
                return status, answer, body
            self._tokens[scope] = self._authorize(answer.get("WWW-Authenticate", ""), scope)
        raise AssertionError("unreachable")

    def _send(self, url: str, headers: dict[str, str]) -> tuple[int, Any, bytes]:
        try:
            with self._session.get(
                url, headers=headers, timeout=(10, self.timeout), stream=True
            ) as response:
                body = response.raw.read(MAX_BYTES, decode_content=True)
                return response.status_code, response.headers, body
        except requests.RequestException as error:
            raise PullError(
                f"cannot reach the registry {self.host} (asked {RETRIES + 1} times): "
                f"{_reason(error)}",
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
        url = fields["realm"] + "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v})
        status, _, body = self._send(url, {"Authorization": basic} if basic else {})
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
        if status == 429 or status >= 500:
            raise PullError(
                f"{self.host} could not send {what}: {detail}, still after {RETRIES} retries",
                hint="the registry is busy or failing: try again later",
            )
        raise PullError(f"{self.host} could not send {what}: {detail}")


def _reason(error: requests.RequestException) -> str:
    """The innermost reason of a failed request (a refused connection, a timeout)."""
    reason: BaseException = error
    while reason.__context__ is not None and str(reason.__context__):
        reason = reason.__context__
    return str(getattr(reason, "reason", reason))


def _json(body: bytes) -> dict[str, Any]:
    try:
        data = nesting.loads(json.loads, body)
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
