"""Which host paths a run may bind: a spec cannot escalate.

A spec comes with the project, and a project may be a repository cloned a minute ago,
so its `mounts:` may name only paths inside the project (symlinks resolved: a link
inside that points out counts as outside). Anything else needs the user's own say: the
`mounts:` section of the user config file, or `--mount SRC:DST[:ro|rw]` on the command
line. Paths that hand over the host (the engines' sockets, /etc, /proc, /dev, ...) or
the user's credentials are refused even then, unless `--allow-mount PATH` names exactly
that path. Outside the project, a mount is read-only unless the user made it writable.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuenv.common.dirs import user_config_file
from gpuenv.common.userconfig import UserConfigError, read_trusted
from gpuenv.common.yamlfile import YamlSyntaxError, read_yaml
from gpuenv.errors import Problem, SpecError, UsageError
from gpuenv.project.spec import WORKSPACE, Spec, display_path

# Refused as a mount source, anything inside them, and anything that contains them.
# The engines' sockets: whoever reaches one is root on the host (Docker's docs, "Docker
# daemon attack surface"); a read-only bind of a socket still lets a client connect.
DENIED_SYSTEM = {
    "/var/run/docker.sock": "the Docker engine's socket — root on the host",
    "/run/docker.sock": "the Docker engine's socket — root on the host",
    "/run/containerd/containerd.sock": "containerd's socket — root on the host",
    "/run/podman/podman.sock": "Podman's socket — root on the host",
    "/run/crio/crio.sock": "CRI-O's socket — root on the host",
    "/run/buildkit/buildkitd.sock": "BuildKit's socket — root on the host",
    "/var/run": "the host's runtime folder, where the engines' sockets are",
    "/run": "the host's runtime folder, where the engines' sockets are",
    "/var/lib/docker": "the Docker engine's storage",
    "/var/lib/containerd": "containerd's storage",
    "/var/lib/containers": "Podman's storage",
    "/etc": "the host's configuration (users, sudoers, ssh)",
    "/proc": "the host's processes and kernel settings",
    "/sys": "the host's kernel and devices",
    "/dev": "the host's devices",
    "/boot": "the host's kernel and boot loader",
    "/root": "root's home",
}
# Below a home folder: credentials for SSH, clouds, clusters, registries, package
# indexes, GPG; and gpuenv's own config, which decides what specs may mount.
CREDENTIALS = {
    ".ssh": "SSH keys",
    ".gnupg": "GPG keys",
    ".aws": "AWS credentials",
    ".azure": "Azure credentials",
    ".config/gcloud": "Google Cloud credentials",
    ".kube": "Kubernetes credentials",
    ".docker": "registry credentials from docker login",
    ".config/containers": "registry credentials from podman login",
    ".netrc": "login credentials",
    ".git-credentials": "git credentials",
    ".pypirc": "package index credentials",
    ".npmrc": "package index credentials",
    ".vault-token": "a Vault token",
    ".config/gh": "GitHub CLI credentials",
    ".config/gpuenv": "gpuenv's user config",
}


@dataclass(frozen=True)
class Bind:
    """A decided bind mount: the resolved host path, the container path, read-only."""

    source: str
    target: str
    read_only: bool

    def to_engine(self) -> dict[str, Any]:
        return {
            "Type": "bind",
            "Source": self.source,
            "Target": self.target,
            "ReadOnly": self.read_only,
        }


@dataclass(frozen=True)
class MountRules:
    """What the user allows beyond the project: folders from the user config (`allow`,
    read-only; `writable`, read-write) and exact paths from --allow-mount."""

    allow: tuple[str, ...] = ()
    writable: tuple[str, ...] = ()
    exact: tuple[str, ...] = ()
    config: str = ""  # the file `allow` came from, for messages

    def with_exact(self, paths: Sequence[str]) -> MountRules:
        resolved = tuple(_resolve(os.path.expanduser(p)) for p in paths)
        return MountRules(self.allow, self.writable, self.exact + resolved, self.config)


@dataclass
class Decision:
    """One mount decided: a Bind, or why it is refused and what would let it through."""

    bind: Bind | None = None
    refused: str = ""
    fix: str = ""
    kind: str = ""  # why refused: denied, outside, missing
    notes: list[str] = field(default_factory=list)


def _absolute(source: str, project_dir: str) -> str:
    expanded = os.path.expanduser(source)
    return expanded if os.path.isabs(expanded) else os.path.join(project_dir, expanded)


def _resolve(path: str) -> str:
    return os.path.realpath(path)


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def user_rules(env: Mapping[str, str] | None = None) -> MountRules:
    """The `mounts:` section of the user config (UsageError when it is malformed)."""
    path = user_config_file(env)
    try:
        data = read_trusted(path)
    except UserConfigError as exc:
        raise UsageError(str(exc)) from None
    section = data.get("mounts") or {}
    if not isinstance(section, dict) or set(section) - {"allow", "writable"}:
        raise UsageError(
            f"{path}: 'mounts' must be a mapping with 'allow' and 'writable' lists of folders"
        )
    lists: dict[str, tuple[str, ...]] = {}
    for key in ("allow", "writable"):
        value = section.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise UsageError(f"{path}: mounts.{key} must be a list of folders")
        if any(not os.path.isabs(os.path.expanduser(v)) for v in value):
            raise UsageError(f"{path}: mounts.{key} takes absolute folders (or ~/...)")
        lists[key] = tuple(_resolve(os.path.expanduser(v)) for v in value)
    return MountRules(lists["allow"], lists["writable"], config=path)


def _home() -> str:
    return _resolve(os.path.expanduser("~"))


def denied(path: str, home: str | None = None) -> str | None:
    """Why `path` (resolved) may not be mounted without --allow-mount, or None.

    >>> denied("/var/run/docker.sock", "/home/ann"), denied("/", "/home/ann")
    ("the Docker engine's socket — root on the host", 'the whole host file system')
    >>> denied("/home/ann/.ssh/id_rsa", "/home/ann"), denied("/home/ann", "/home/ann")
    ('SSH keys', 'a home folder, which holds SSH keys')
    >>> denied("/srv/data", "/home/ann") is None
    True
    """
    home = _home() if home is None else home
    if path == "/":
        return "the whole host file system"
    for name, why in CREDENTIALS.items():
        if _within(path, f"{home}/{name}") or f"/{name}/" in f"{path}/":
            return why
    for listed, why in DENIED_SYSTEM.items():
        for form in {listed, _resolve(listed)}:
            if _within(path, form) or _within(form, path):
                return why
    for folder in {home, "/home"}:
        if folder != "/" and _within(folder, path):
            return "a home folder, which holds SSH keys" if path == home else "users' home folders"
    return None


def decide(
    source: str,
    target: str,
    project_dir: str,
    rules: MountRules,
    *,
    from_user: bool,
    read_only: bool | None,
    home: str | None = None,
) -> Decision:
    """Decide one mount. `from_user`: named on the command line (--mount), not by the
    spec. `read_only`: what was asked (None: the default for where it is)."""
    absolute = _absolute(source, project_dir)
    resolved = _resolve(absolute)
    root = _resolve(project_dir)
    inside = _within(resolved, root)
    shown = source if resolved == os.path.abspath(absolute) else f"{source} (→ {resolved})"
    exact = resolved in rules.exact
    why = denied(resolved, home)
    if why and not exact:
        named = expanded if os.path.isabs(expanded := os.path.expanduser(source)) else resolved
        return Decision(
            refused=f"{shown} is on gpuenv's deny list: {why}",
            fix=f"--allow-mount {named}",
            kind="denied",
        )
    if not os.path.exists(absolute):
        return Decision(
            refused=f"{source} does not exist", fix="create it, or fix the path", kind="missing"
        )
    allowed = any(_within(resolved, a) for a in rules.allow + rules.writable)
    if not inside and not from_user and not exact and not allowed:
        where = rules.config or "the user config file"
        return Decision(
            refused=f"{shown} is outside the project: a spec may mount only paths "
            "inside the project folder",
            fix=f"list it (or a folder above it) under `mounts: allow:` in {where}, or "
            f"pass `--mount {source}:{target}`",
            kind="outside",
        )
    decision = Decision()
    if inside:
        ro = bool(read_only)
    elif from_user:
        ro = read_only is not False
    else:
        may_write = any(_within(resolved, w) for w in rules.writable)
        ro = bool(read_only) or not may_write
        if not may_write and read_only is False:
            decision.notes.append(
                f"{source} is mounted read-only: it is outside the project "
                "(list it under `mounts: writable:` in the user config to let specs write there)"
            )
    decision.bind = Bind(resolved, target, ro)
    return decision


def parse_mount_flag(text: str) -> tuple[str, str, bool | None]:
    """``SRC:DST[:ro|rw]`` -> (source, target, read_only or None for the default).

    >>> parse_mount_flag("/data:/data"), parse_mount_flag("~/x:/x:rw")
    (('/data', '/data', None), ('~/x', '/x', False))
    """
    parts = text.split(":")
    mode_ok = len(parts) == 2 or (len(parts) == 3 and parts[2] in ("ro", "rw"))
    if not mode_ok or not all(parts[:2]):
        raise UsageError(f"--mount {text!r}: expected SRC:DST, SRC:DST:ro or SRC:DST:rw")
    source, target = parts[0], parts[1]
    if not target.startswith("/") or ".." in target.split("/") or "," in text:
        raise UsageError(f"--mount {text!r}: DST must be an absolute path without '..' or ','")
    return source, target.rstrip("/") or "/", None if len(parts) == 2 else parts[2] == "ro"


def _spec_problem(spec: Spec, index: int, message: str) -> Problem:
    shown = display_path(spec.path) if spec.path else "gpuenv.yaml"
    try:
        doc = read_yaml(spec.path, shown) if spec.path else None
    except (OSError, YamlSyntaxError):
        doc = None
    if doc is None:
        return Problem(shown, None, None, f"mounts[{index}].source", message)
    return doc.problem(("mounts", index, "source"), message)


def spec_binds(
    spec: Spec,
    rules: MountRules,
    notice: Callable[[str], None] = lambda _: None,
    home: str | None = None,
    missing: list[str] | None = None,
) -> list[Bind]:
    """The spec's mounts as binds; SpecError (exit 3) naming each refused entry. With
    `missing`, a source that does not exist (yet) is listed there instead of refused."""
    problems, binds = [], []
    fixes: list[tuple[str, str]] = []
    for index, mount in enumerate(spec.mounts):
        decision = decide(
            mount.source,
            mount.target,
            spec.project_dir,
            rules,
            from_user=False,
            read_only=mount.read_only,
            home=home,
        )
        if decision.kind == "missing" and missing is not None:
            missing.append(mount.source)
        elif decision.bind is None:
            problems.append(_spec_problem(spec, index, decision.refused))
            fixes.append((decision.kind, decision.fix))
        else:
            binds.append(decision.bind)
            for note in decision.notes:
                notice(note)
    if problems:
        raise SpecError(problems, hint=_hint(fixes))
    return binds


def _hint(fixes: Sequence[tuple[str, str]]) -> str:
    """One hint for every refusal: deny-listed paths, outside paths, missing ones."""
    parts = []
    denied_flags = [fix for kind, fix in fixes if kind == "denied"]
    if denied_flags:
        parts.append(
            "gpuenv refuses deny-listed paths even where the user config allows them; if "
            f"you are sure, name each on the command line: {' '.join(denied_flags)}"
        )
    parts += list(dict.fromkeys(fix for kind, fix in fixes if kind != "denied"))
    return "; ".join(parts)


def flag_binds(
    values: Sequence[str], project_dir: str, rules: MountRules, home: str | None = None
) -> list[Bind]:
    """--mount values as binds; UsageError (exit 2) for a refused one."""
    binds = []
    for text in values:
        source, target, read_only = parse_mount_flag(text)
        decision = decide(
            source, target, project_dir, rules, from_user=True, read_only=read_only, home=home
        )
        if decision.bind is None:
            raise UsageError(
                f"--mount {text}: {decision.refused}", hint=_hint([(decision.kind, decision.fix)])
            )
        binds.append(decision.bind)
    return binds


def run_binds(
    spec: Spec,
    mounts: Sequence[str] = (),
    allow: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    notice: Callable[[str], None] = lambda _: None,
) -> list[Bind]:
    """Every extra bind of a run: the spec's (under the user's rules), then --mount's;
    a target named twice is a usage error."""
    rules = user_rules(env).with_exact(allow)
    binds = spec_binds(spec, rules, notice) + flag_binds(mounts, spec.project_dir, rules)

    seen = {WORKSPACE}
    for bind in binds:
        if bind.target in seen:
            raise UsageError(
                f"two mounts have the target {bind.target}",
                hint="give the --mount a different DST (the project is at /workspace)",
            )
        seen.add(bind.target)
    return binds


def check_mounts(spec: Spec, env: Mapping[str, str] | None = None) -> str:
    """`gpuenv check`: the spec's mounts as a run would decide them (SpecError for one a
    run would refuse); sources missing on this host are named as not checked."""
    missing: list[str] = []
    binds = spec_binds(spec, user_rules(env), missing=missing)
    shown = ", ".join(
        f"{display_path(b.source)} → {b.target} ({'read-only' if b.read_only else 'read-write'})"
        for b in binds
    )
    text = f"mounts: {shown}" if shown else "mounts:"
    if missing:
        text += f"{';' if shown else ''} not checked (not on this host): {', '.join(missing)}"
    return text
