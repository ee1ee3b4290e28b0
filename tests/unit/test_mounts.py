"""The mount policy: what a spec, the user config, --mount and --allow-mount let a run
bind (gpuenv.project.mounts)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuenv.errors import SpecError, UsageError
from gpuenv.project.mounts import (
    MountRules,
    decide,
    denied,
    flag_binds,
    run_binds,
    spec_binds,
    user_rules,
)
from gpuenv.project.validate import load_spec

HOME = "/home/ann"


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/var/run/docker.sock", "the Docker engine's socket"),
        ("/run/docker.sock", "the Docker engine's socket"),
        ("/run/containerd/containerd.sock", "containerd's socket"),
        ("/run/podman/podman.sock", "Podman's socket"),
        ("/run/user/1000/docker.sock", "runtime folder"),
        ("/", "the whole host"),
        ("/etc", "configuration"),
        ("/etc/passwd", "configuration"),
        ("/proc/1/root", "processes"),
        ("/sys", "kernel"),
        ("/dev/sda", "devices"),
        ("/root", "root's home"),
        ("/boot", "boot"),
        ("/var", "socket"),  # it holds /var/run/docker.sock
        ("/var/lib/docker/volumes", "storage"),
        (f"{HOME}/.ssh", "SSH keys"),
        (f"{HOME}/.ssh/id_ed25519", "SSH keys"),
        (f"{HOME}/.aws/credentials", "AWS"),
        (f"{HOME}/.kube/config", "Kubernetes"),
        (f"{HOME}/.docker/config.json", "docker login"),
        (f"{HOME}/.gnupg", "GPG"),
        (f"{HOME}/.config/gcloud", "Google Cloud"),
        (f"{HOME}/.netrc", "login credentials"),
        (f"{HOME}/.git-credentials", "git credentials"),
        (f"{HOME}/.pypirc", "package index"),
        (f"{HOME}/.config/gpuenv/config.yaml", "gpuenv's user config"),
        (HOME, "a home folder"),
        ("/home", "home folders"),
        ("/home/bob/.ssh", "SSH keys"),  # another user's: with --root it would be readable
        ("/srv/data", None),
        ("/data/imagenet", None),
        (f"{HOME}/datasets", None),
        ("/tmp/scratch", None),
        ("/var/tmp/cache", None),
        ("/usr/share/dict", None),
    ],
)
def test_deny_list(path: str, reason: str | None) -> None:
    found = denied(path, HOME)
    if reason is None:
        assert found is None
    else:
        assert found is not None and reason in found


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, str]:
    project = tmp_path / "proj"
    (project / "data").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "sub").mkdir()
    (project / "link-out").symlink_to(outside)
    (project / "link-in").symlink_to(project / "data")
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / "datasets").mkdir()
    return {
        "project": str(project),
        "outside": str(outside),
        "home": str(home),
        "ssh": str(home / ".ssh"),
    }


# (source, rules, from_user, read_only asked) -> (read-only bind | refusal text)
CASES = [
    ("data", {}, False, False, False),
    ("data", {}, False, True, True),
    ("./data/", {}, False, None, False),
    ("link-in", {}, False, False, False),
    ("link-out", {}, False, False, "outside the project"),  # a symlink pointing out
    ("{outside}", {}, False, False, "outside the project"),
    ("{outside}", {"allow": ["{outside}"]}, False, False, True),  # read-only outside
    ("{outside}/sub", {"allow": ["{outside}"]}, False, False, True),
    ("link-out", {"allow": ["{outside}"]}, False, False, True),
    ("{outside}", {"writable": ["{outside}"]}, False, False, False),
    ("{outside}", {"writable": ["{outside}"]}, False, True, True),
    ("{outside}", {}, True, None, True),  # --mount: the user's choice, read-only by default
    ("{outside}", {}, True, False, False),  # --mount SRC:DST:rw
    ("data", {}, True, None, False),
    ("/etc", {}, False, False, "configuration"),
    ("/etc", {"allow": ["/etc"]}, False, False, "configuration"),  # the config is not enough
    ("/etc", {"allow": ["/etc"], "exact": ["/etc"]}, False, False, True),
    ("/etc", {"exact": ["/etc"]}, False, False, True),  # --allow-mount names it exactly
    ("/etc", {"exact": ["/etc/ssh"]}, False, False, "configuration"),  # not exactly
    ("/etc", {}, True, None, "configuration"),  # --mount alone neither
    ("/proc", {"exact": ["/proc/1"]}, True, None, "processes"),
    ("/", {"allow": ["/"]}, False, False, "whole host"),
    ("{ssh}", {"allow": ["{home}"]}, False, False, "SSH keys"),
    ("{home}", {"allow": ["{home}"]}, False, False, "home folder"),
    ("{home}/datasets", {"allow": ["{home}"]}, False, False, True),
    ("{ssh}", {"exact": ["{ssh}"]}, True, None, True),
    ("missing", {}, False, False, "does not exist"),
    ("/var/run/docker.sock", {}, False, False, "socket"),  # refused whether it exists or not
    ("/run/gpuenv-test-nothing.sock", {}, True, None, "runtime folder"),
]


@pytest.mark.parametrize(("source", "rules", "from_user", "asked", "expected"), CASES)
def test_decide(
    tree: dict[str, str],
    source: str,
    rules: dict[str, list[str]],
    from_user: bool,
    asked: bool | None,
    expected: bool | str,
) -> None:
    def fill(text: str) -> str:
        return text.format(**tree)

    made = MountRules(
        *(
            tuple(os.path.realpath(fill(p)) for p in rules.get(k, []))
            for k in ("allow", "writable", "exact")
        )
    )
    decision = decide(
        fill(source),
        "/mnt",
        tree["project"],
        made,
        from_user=from_user,
        read_only=asked,
        home=os.path.realpath(tree["home"]),
    )
    if isinstance(expected, str):
        assert decision.bind is None and expected in decision.refused and decision.fix
    else:
        assert decision.bind is not None and decision.bind.read_only is expected
        assert decision.bind.source == os.path.realpath(os.path.join(tree["project"], fill(source)))


def test_spec_refusal_names_the_line_and_the_fix(tree: dict[str, str]) -> None:
    spec_file = Path(tree["project"]) / "gpuenv.yaml"
    spec_file.write_text(
        "framework: none\nmounts:\n  - data:/data\n"
        "  - /var/run:/sock\n  - source: /etc\n    target: /host-etc\n"
    )
    spec = load_spec(tree["project"])
    with pytest.raises(SpecError) as raised:
        spec_binds(spec, MountRules(), home=tree["home"])
    text = str(raised.value)
    assert "gpuenv.yaml:4" in text and "mounts[1].source" in text
    assert "gpuenv.yaml:5" in text and "mounts[2].source" in text
    assert raised.value.exit_code == 3 and "--allow-mount" in (raised.value.hint or "")


def test_flag_refusal_is_a_usage_error(tree: dict[str, str]) -> None:
    with pytest.raises(UsageError, match="/etc is on gpuenv's deny list") as raised:
        flag_binds(["/etc:/host-etc"], tree["project"], MountRules())
    assert raised.value.exit_code == 2 and "--allow-mount /etc" in (raised.value.hint or "")
    for bad in ("/data", "a:b:c", "/x:relative", "/x:/y:rx", "/x:/a/../b"):
        with pytest.raises(UsageError, match="--mount"):
            flag_binds([bad], tree["project"], MountRules())


def _write_config(path: Path, text: str, mode: int = 0o600) -> dict[str, str]:
    path.write_text(text)
    path.chmod(mode)
    return {"GPUENV_CONFIG": str(path)}


def test_user_config(tree: dict[str, str], tmp_path: Path) -> None:
    env = _write_config(
        tmp_path / "config.yaml",
        f"registry_mirror: m:5000\nmounts:\n  allow: [{tree['outside']}]\n  writable: [/tmp]\n",
    )
    rules = user_rules(env)
    assert rules.allow == (os.path.realpath(tree["outside"]),) and rules.writable == (
        os.path.realpath("/tmp"),
    )
    assert user_rules({"GPUENV_CONFIG": str(tmp_path / "none.yaml")}) == MountRules(
        config=str(tmp_path / "none.yaml")
    )


@pytest.mark.parametrize(
    ("text", "mode", "message"),
    [
        ("mounts: [/data]\n", 0o600, "must be a mapping"),
        ("mounts:\n  allow: /data\n", 0o600, "list of folders"),
        ("mounts:\n  allow: [data]\n", 0o600, "absolute"),
        ("mounts:\n  alow: [/data]\n", 0o600, "must be a mapping"),
        ("mounts:\n  allow: [/data]\n", 0o666, "may write it"),
        ("- a\n", 0o600, "mapping of settings"),
    ],
)
def test_bad_user_config(tmp_path: Path, text: str, mode: int, message: str) -> None:
    env = _write_config(tmp_path / "config.yaml", text, mode)
    with pytest.raises(UsageError, match=message):
        user_rules(env)


def test_run_binds(tree: dict[str, str], tmp_path: Path) -> None:
    (Path(tree["project"]) / "gpuenv.yaml").write_text(
        f"framework: none\nmounts: ['{tree['outside']}:/out']\n"
    )
    spec = load_spec(tree["project"])
    env = _write_config(tmp_path / "c.yaml", f"mounts:\n  allow: [{tree['outside']}]\n")
    notes: list[str] = []
    binds = run_binds(spec, [f"{tree['outside']}/sub:/sub:rw"], env=env, notice=notes.append)
    assert [(b.target, b.read_only) for b in binds] == [("/out", True), ("/sub", False)]
    assert notes and "read-only" in notes[0]
    with pytest.raises(UsageError, match="two mounts have the target /out"):
        run_binds(spec, [f"{tree['outside']}:/out"], env=env)
    with pytest.raises(SpecError, match="outside the project"):
        run_binds(spec, env={"GPUENV_CONFIG": str(tmp_path / "none.yaml")})


def test_check_reports_a_mount_a_run_would_refuse(tree: dict[str, str], tmp_path: Path) -> None:
    from gpuenv.app.check import check_project

    spec_file = Path(tree["project"]) / "gpuenv.yaml"
    env = {"GPUENV_CONFIG": str(tmp_path / "none.yaml")}
    spec_file.write_text("framework: none\nmounts: ['/etc:/host-etc', 'data:/data']\n")
    (item,) = [i for i in check_project(tree["project"], env).items if i.subject == "mounts"]
    assert isinstance(item.error, SpecError) and "mounts[0].source" in str(item.error)
    assert check_project(tree["project"], env).exit_code == 3
    spec_file.write_text("framework: none\nmounts: ['data:/data:ro', '/not/here:/x']\n")
    (item,) = [i for i in check_project(tree["project"], env).items if i.subject == "mounts"]
    assert item.error is None and item.ok is not None
    assert (
        "→ /data (read-only)" in item.ok and "not checked (not on this host): /not/here" in item.ok
    )
