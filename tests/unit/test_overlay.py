"""gpuenv.lock's overlay as data: the resolver's report in, the lock section, the lines a
build installs, what changed, and pylock.toml out (no engine)."""

from __future__ import annotations

import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from gpuenv.errors import LockError
from gpuenv.lock.overlay import changes, overlay_from_data, overlay_from_report, sdist_notes

SHA = {name: name[0] * 64 for name in ("abc", "def", "fed")}
OPTIONS = ["--index-url=https://idx.example/simple/", "--find-links=/opt/wheelhouse"]


def report(*items: dict[str, object]) -> dict[str, object]:
    return {
        "inventory": {"count": 212, "digest": "sha256:" + "9" * 64},
        "constraint_files": {"/etc/pip/constraint.txt": "sha256:" + "8" * 64},
        "python": "3.12.3",
        "pip": "25.0",
        "packages": list(items),
        "where": {"tqdm": "requirements.txt:2"},
    }


def item(name: str, version: str, url: str, **more: object) -> dict[str, object]:
    return {"name": name, "version": version, "url": url, **more}


def test_a_report_becomes_the_locked_set_in_install_order() -> None:
    overlay, refused = overlay_from_report(
        report(
            item(
                "tqdm",
                "4.70.1",
                "https://idx.example/f/tqdm-4.70.1-py3-none-any.whl",
                sha256=SHA["abc"],
            ),
            item(
                "flash-attn",
                "2.7.4",
                "https://idx.example/f/flash_attn-2.7.4.tar.gz",
                sha256=SHA["def"],
                group="late",
            ),
            item(
                "six",
                "1.16.0",
                "file:///opt/wheelhouse/six-1.16.0-py2.py3-none-any.whl",
                sha256=SHA["fed"],
            ),
        ),
        OPTIONS,
        {"requirements.txt": "sha256:1"},
    )
    assert refused == []
    assert [p.line() for p in overlay.packages] == [
        f"six==1.16.0 --hash=sha256:{SHA['fed']}",
        f"tqdm==4.70.1 --hash=sha256:{SHA['abc']}",
        f"flash-attn==2.7.4 --hash=sha256:{SHA['def']}",  # late: installed last
    ]
    assert overlay.get("tqdm").index == "https://idx.example/simple/"  # type: ignore[union-attr]
    assert overlay.get("six").index == "/opt/wheelhouse"  # type: ignore[union-attr]
    assert overlay.base is not None and overlay.base.distributions == 212
    # The lock's section reads back as it was written.
    assert overlay_from_data(overlay.to_data(), "gpuenv.lock") == overlay
    # A source distribution is pinned by its archive, and said to build unpinned.
    (note,) = sdist_notes(overlay)
    assert note.startswith("flash-attn==2.7.4 is a source distribution") and "pip wheel" in note


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ({"vcs": "git", "commit": "abc"}, "a git requirement has no file to hash"),
        ({"directory": True, "editable": True}, "a local folder is not a file gpuenv can pin"),
        ({}, "gave no sha256 and could not be read"),
    ],
)
def test_what_cannot_be_locked_is_named(extra: dict[str, object], said: str) -> None:
    _, refused = overlay_from_report(
        report(item("tqdm", "4.70.1", "https://ann:tok@idx.example/tqdm.whl", **extra)), OPTIONS, {}
    )
    (only,) = refused
    assert only.name == "tqdm" and only.where == "requirements.txt:2" and said in only.reason
    assert "tok" not in str(only)


def test_a_url_keeps_no_credentials() -> None:
    overlay, _ = overlay_from_report(
        report(
            item("x", "1", "https://ann:tok@idx.example/f/x-1-py3-none-any.whl", sha256=SHA["abc"])
        ),
        OPTIONS,
        {},
    )
    assert overlay.packages[0].url == "https://idx.example/f/x-1-py3-none-any.whl"


def test_changes_name_what_moved() -> None:
    def locked(**versions: str):
        found, _ = overlay_from_report(
            report(
                *(
                    item(n, v, f"https://i/{n}-{v}-py3-none-any.whl", sha256=SHA["abc"])
                    for n, v in versions.items()
                )
            ),
            OPTIONS,
            {},
        )
        return found

    old = locked(tqdm="4.70.0", six="1.16.0")
    new = locked(tqdm="4.70.1", rich="15.0.0")
    assert changes(old, new) == ["+ rich 15.0.0", "- six 1.16.0", "~ tqdm 4.70.0 → 4.70.1"]
    swapped = replace(new, packages=(replace(new.packages[0], sha256=SHA["def"]), new.packages[1]))
    assert changes(new, swapped)[0].startswith("~ rich 15.0.0 (another file")
    assert changes(None, old) == ["+ six 1.16.0", "+ tqdm 4.70.0"]


@pytest.mark.parametrize(
    "section",
    [
        "not a mapping",
        {"resolved": "yes"},
        {"resolved": True, "packages": "x"},
        {
            "resolved": True,
            "base": None,
            "packages": [{"name": "x", "version": "1", "sha256": "short"}],
        },
        {"resolved": True, "base": None, "packages": [], "options": "x"},
    ],
)
def test_a_damaged_section_is_a_lock_error(section: object) -> None:
    with pytest.raises(LockError, match=r"gpuenv\.lock is damaged"):
        overlay_from_data(section, "gpuenv.lock")


def test_pylock_is_pep_751_and_names_the_base(tmp_path: Path) -> None:
    from gpuenv.lock.lockfile import Lock
    from gpuenv.lock.pylock import render_pylock

    overlay, _ = overlay_from_report(
        report(
            item(
                "tqdm",
                "4.70.1",
                "https://idx.example/f/tqdm-4.70.1-py3-none-any.whl",
                sha256=SHA["abc"],
            ),
            item("x", "1.0", "https://idx.example/f/x-1.0.tar.gz", sha256=SHA["def"]),
        ),
        OPTIONS,
        {},
    )
    lock = Lock(
        spec_hash="sha256:0",
        requirements={},
        matrix_version="m",
        image="nvcr.io/nvidia/pytorch:25.03-py3",
        digest="sha256:" + "c" * 64,
        resolved={"python": "3.12"},
        requires={},
        resolved_for={},
        overlay=overlay,
    )
    data = tomllib.loads(render_pylock(lock))
    assert data["lock-version"] == "1.0" and data["requires-python"] == "==3.12.*"
    tqdm, x = data["packages"]
    assert tqdm["wheels"] == [
        {
            "name": "tqdm-4.70.1-py3-none-any.whl",
            "url": "https://idx.example/f/tqdm-4.70.1-py3-none-any.whl",
            "hashes": {"sha256": SHA["abc"]},
        }
    ]
    assert tqdm["index"] == "https://idx.example/simple/"
    assert x["sdist"]["hashes"] == {"sha256": SHA["def"]} and "wheels" not in x
    assert data["tool"]["gpuenv"]["base"] == "nvcr.io/nvidia/pytorch@sha256:" + "c" * 64


GOOD = {"name": "tqdm", "version": "4.70.1", "sha256": "a" * 64, "url": "https://i/t.whl"}


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        # A lock a repository ships reaches files a build reads (overlay.txt, a .pth):
        # nothing in it may add a line, an option or a path outside /workspace.
        ({"paths": ["/workspace\rimport os"]}, "not a folder below /workspace"),
        ({"paths": ["/workspace/../etc"]}, "not a folder below /workspace"),
        ({"paths": ["/workspacex"]}, "not a folder below /workspace"),
        ({"options": ["--target=/usr/bin"]}, "an option gpuenv does not pass"),
        ({"options": ["--index-url=https://i/\n--pre"]}, "an option gpuenv does not pass"),
        ({"packages": [{**GOOD, "name": "tqdm\nevil==1"}]}, "not a package name"),
        ({"packages": [{**GOOD, "version": "1 --target /x"}]}, "not a version"),
        ({"packages": [{**GOOD, "url": "https://i/t.whl --pre"}]}, "not a URL gpuenv installs"),
        ({"packages": [{**GOOD, "direct": True, "url": ""}]}, "without its URL"),
        ({"base": {"python_distributions": "x", "inventory": "sha256:1"}}, "its count"),
    ],
)
def test_a_crafted_lock_is_refused(edit: dict[str, object], said: str) -> None:
    section = {
        "resolved": True,
        "base": {"python_distributions": 3, "inventory": "sha256:" + "0" * 64},
        "options": ["--index-url=https://i/simple/"],
        "packages": [GOOD],
        **edit,
    }
    with pytest.raises(LockError, match=said):
        overlay_from_data(section, "gpuenv.lock")


def test_a_package_required_by_url_is_installed_from_it() -> None:
    overlay, _ = overlay_from_report(
        report(
            item(
                "flash-attn",
                "2.8.3",
                "https://github.example/releases/flash_attn-2.8.3-cp312-linux_x86_64.whl",
                sha256=SHA["abc"],
                direct=True,
            )
        ),
        OPTIONS,
        {},
    )
    (package,) = overlay.packages
    assert package.line() == (
        "flash-attn @ https://github.example/releases/flash_attn-2.8.3-cp312-linux_x86_64.whl "
        f"--hash=sha256:{SHA['abc']}"
    )
    assert package.index == ""  # no index served it
    assert overlay_from_data(overlay.to_data(), "gpuenv.lock") == overlay


def test_a_malformed_report_is_a_resolution_error() -> None:
    from gpuenv.errors import ResolutionError

    with pytest.raises(ResolutionError, match="no inventory"):
        overlay_from_report({"packages": [], "inventory": "x"}, OPTIONS, {})
    with pytest.raises(ResolutionError, match="not one"):
        overlay_from_report({**report(), "packages": ["x"]}, OPTIONS, {})
    bad = item("tqdm", "", "https://i/t.whl", sha256=SHA["abc"])
    with pytest.raises(ResolutionError, match="not a version"):
        overlay_from_report(report(bad), OPTIONS, {})


def test_an_edit_of_the_specs_packages_makes_the_packages_stale(tmp_path: Path) -> None:
    from gpuenv.lock.lockfile import overlay_differences, overlay_sources
    from gpuenv.project.validate import load_spec

    (tmp_path / "gpuenv.yaml").write_text("framework: pytorch\npackages: [tqdm]\n")
    spec = load_spec(str(tmp_path))
    overlay, _ = overlay_from_report(report(), OPTIONS, overlay_sources(spec, {}))
    from gpuenv.lock.lockfile import Lock

    lock = Lock("s", {}, "m", "i", "", {}, {}, {}, overlay=overlay)
    assert overlay_differences(lock, spec, {}) == []
    (tmp_path / "gpuenv.yaml").write_text("framework: pytorch\npackages: [tqdm, rich]\n")
    (said,) = overlay_differences(lock, load_spec(str(tmp_path)), {})
    assert said.startswith("gpuenv.yaml (requirements, packages, extras) changed")
    # A spec that installs no Python package needs none locked (a lock_version 1 lock).
    (tmp_path / "gpuenv.yaml").write_text("framework: pytorch\n")
    old = Lock("s", {}, "m", "i", "", {}, {}, {})
    assert overlay_differences(old, load_spec(str(tmp_path)), {}) == []
