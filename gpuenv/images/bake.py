"""What `--bake` may put in an image that `gpuenv push` then uploads: no file that looks
like a credential, by its name or by what it holds (gpuenv.images.secrets), unless the
user says so, and no more than BAKE_LIMIT bytes of project
unless confirmed (checkpoints and data sets do not belong in an image).

Both decisions are made on the files .dockerignore keeps (gpuenv.images.context), so
excluding a file there is always a way out.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from gpuenv.errors import BuildError
from gpuenv.images.context import ContextFile
from gpuenv.images.dockerignore import BadPattern, PatternMatcher
from gpuenv.images.secrets import SCAN_LIMIT, find_secrets

BAKE_LIMIT = 2 * 1024**3
# Credential-looking paths, in .dockerignore syntax, anywhere in the project: the usual
# homes of cloud, cluster, registry, SSH and package-index credentials, private keys and
# key stores, and .env files (`!` lines: the look-alikes that hold no secret).
CREDENTIAL_PATTERNS = (
    "**/.ssh",
    "**/.aws",
    "**/.azure",
    "**/.kube",
    "**/kubeconfig",
    "**/.gnupg",
    "**/.config/gcloud",
    "**/application_default_credentials.json",
    "**/credentials.json",
    "**/.docker/config.json",
    "**/.git-credentials",
    "**/.netrc",
    "**/.pypirc",
    "**/.npmrc",
    "**/.vault-token",
    "**/.htpasswd",
    "**/id_rsa*",
    "**/id_dsa*",
    "**/id_ecdsa*",
    "**/id_ed25519*",
    "!**/id_*.pub",
    "**/*.pem",
    "**/*.key",
    "**/*.p12",
    "**/*.pfx",
    "**/*.jks",
    "**/*.keystore",
    "**/.env",
    "**/.env.*",
    "!**/.env.example",
    "!**/.env.sample",
    "!**/.env.template",
)
_SHOWN = 10


@dataclass(frozen=True)
class BakePolicy:
    """What the user allowed on the command line: --allow-secret PATTERN (repeatable,
    .dockerignore syntax) and --allow-large."""

    allow_secrets: tuple[str, ...] = ()
    allow_large: bool = False


@dataclass(frozen=True)
class BakeSummary:
    """How much project the image carries, and its largest top-level entries."""

    total: int
    count: int
    largest: tuple[tuple[str, int], ...]

    def describe(self) -> str:
        parts = ", ".join(f"{name} {human_size(size)}" for name, size in self.largest)
        noun = "file" if self.count == 1 else "files"
        return f"baked {human_size(self.total)} of project ({self.count} {noun})" + (
            f"; largest: {parts}" if parts else ""
        )


def human_size(size: int) -> str:
    """Bytes for people, in binary units.

    >>> human_size(512), human_size(3 * 1024**2), human_size(5 * 1024**3 // 2)
    ('512 B', '3.0 MiB', '2.5 GiB')
    """
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


@functools.cache
def _credentials() -> tuple[PatternMatcher, tuple[tuple[str, PatternMatcher], ...]]:
    each = tuple((p, PatternMatcher([p])) for p in CREDENTIAL_PATTERNS if not p.startswith("!"))
    return PatternMatcher(CREDENTIAL_PATTERNS), each


def _credential_reason(path: str) -> str | None:
    """The credential pattern `path` (relative to the project) matches, or None."""
    every, each = _credentials()
    if not every.excluded(path):
        return None
    for pattern, matcher in each:
        if matcher.excluded(path):
            direct = matcher.patterns[0].match(path)  # else a folder above it matched
            return pattern.removeprefix("**/") + ("" if direct else "/")
    return None


def _allowed(patterns: Sequence[str]) -> PatternMatcher:
    try:
        return PatternMatcher(patterns)
    except BadPattern as exc:
        raise BuildError(f"--allow-secret: {exc}") from None


def summarize(files: Sequence[ContextFile], largest: int = 5) -> BakeSummary:
    by_entry: dict[str, int] = {}
    for item in files:
        relative = item.name.removeprefix("project/")
        top, sep, _ = relative.partition("/")
        key = f"{top}/" if sep else top
        by_entry[key] = by_entry.get(key, 0) + item.size
    ranked = sorted(by_entry.items(), key=lambda kv: (-kv[1], kv[0]))
    return BakeSummary(sum(by_entry.values()), len(files), tuple(ranked[:largest]))


def _content_reason(item: ContextFile) -> str | None:
    """What credential a small project file holds (gpuenv.images.secrets), by line."""
    if item.link is not None or item.size > SCAN_LIMIT:
        return None
    try:
        data = item.content()
    except OSError:
        return None  # the build reads it and says what is wrong
    found = find_secrets(item.name, data[: SCAN_LIMIT + 1])
    if not found:
        return None
    first = found[0]
    return f"line {first.line}: {first.what}, gitleaks rule {first.rule}"


def check_bake(files: Sequence[ContextFile], policy: BakePolicy) -> BakeSummary:
    """Refuse (BuildError, exit 12) credential-looking files, by name or by content, the
    user did not allow, and a project over BAKE_LIMIT without --allow-large; else how
    much is baked."""
    project = [f for f in files if f.name.startswith("project/")]
    allowed = _allowed(policy.allow_secrets)
    found = []
    for item in project:
        relative = item.name.removeprefix("project/")
        if allowed.excluded(relative):
            continue
        if reason := _credential_reason(relative):
            found.append((relative, f"matches {reason}"))
        elif reason := _content_reason(item):
            found.append((relative, reason))
    if found:
        listed = "\n".join(f"  {path}  ({reason})" for path, reason in found[:_SHOWN])
        more = f"\n  … and {len(found) - _SHOWN} more" if len(found) > _SHOWN else ""
        raise BuildError(
            f"--bake would copy {len(found)} credential-looking "
            f"{'file' if len(found) == 1 else 'files'} into the image (and `gpuenv push` "
            f"would upload them):\n{listed}{more}",
            hint="list them in .dockerignore (e.g. `"
            + "`, `".join(sorted({p for p, _ in found[:3]}))
            + "`); if one belongs in the image, pass --allow-secret PATH for it, or mark a "
            "line that only looks like one with a `gpuenv:allow-secret` comment",
        )
    summary = summarize(project)
    if summary.total > BAKE_LIMIT and not policy.allow_large:
        raise BuildError(
            f"--bake would copy {human_size(summary.total)} of project into the image, more "
            f"than {human_size(BAKE_LIMIT)}: "
            + ", ".join(f"{name} {human_size(size)}" for name, size in summary.largest),
            hint="data sets and checkpoints belong in a mount, not an image: list them in "
            ".dockerignore; or confirm with --allow-large",
        )
    return summary
