#!/usr/bin/env python3
"""Write matrices/companions.yaml: what version of its framework each release of a
companion package (torchvision, torchaudio, tf-keras) requires, read from the package's
own metadata on PyPI (the Requires-Dist of its smallest wheel; PEP 691 JSON index, and
PEP 658 metadata where PyPI has it). A release whose metadata names no framework version
is listed with `requires: null` (unknown stays unknown), unless its maintainers state the
rule it follows (RULES: tf-keras follows TensorFlow's minor), which is then named. Needs the network (pypi.org);
run by a maintainer, and the result committed:

    .venv/bin/python scripts/companions.py > matrices/companions.yaml
"""

from __future__ import annotations

import datetime
import io
import json
import sys
import urllib.request
import zipfile

from packaging.requirements import Requirement
from packaging.utils import parse_wheel_filename
from packaging.version import Version

# companion -> (its framework's package, the oldest release listed)
COMPANIONS = {
    "torchvision": ("torch", "0.13"),
    "torchaudio": ("torch", "0.13"),
    "tf-keras": ("tensorflow", "2.14"),
}
INDEX = "https://pypi.org/simple"
# Where a release's metadata names no framework version but its maintainers state the
# rule it follows. tf-keras follows TensorFlow's minor: keras-team/tf-keras PR #758
# ("match TF version ignoring the [patch] version") and PR #759, which added the
# dependency in 2.15.1 "so that users can't install tf-keras 2.15 with TensorFlow 2.16.
# This will cause errors".
RULES = {
    "tf-keras": (
        "tensorflow<{major}.{next},>={major}.{minor}",
        "tf-keras maintainers' rule (keras-team/tf-keras PR #758, #759): tf-keras X.Y "
        "follows TensorFlow X.Y; {wheel} METADATA names none",
    ),
}


def _releases(package: str, oldest: str) -> dict[Version, tuple[str, str, bool]]:
    """Each final release's smallest wheel: (file name, URL, has PEP 658 metadata)."""
    request = urllib.request.Request(
        f"{INDEX}/{package}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        files = json.load(answer)["files"]
    best: dict[Version, tuple[int, str, str, bool]] = {}
    for item in files:
        name = item["filename"]
        if not name.endswith(".whl") or item.get("yanked"):
            continue
        _, version, _, _ = parse_wheel_filename(name)
        if version.is_prerelease or version.local or version < Version(oldest):
            continue
        size = int(item.get("size") or 1 << 40)
        metadata = bool(item.get("core-metadata") or item.get("data-dist-info-metadata"))
        if version not in best or size < best[version][0]:
            best[version] = (size, name, item["url"], metadata)
    return {v: (name, url, meta) for v, (_, name, url, meta) in best.items()}


def _requires_dist(url: str, metadata: bool) -> list[str]:
    if metadata:
        with urllib.request.urlopen(url + ".metadata", timeout=60) as answer:
            text = answer.read().decode()
    else:
        with urllib.request.urlopen(url, timeout=300) as answer:
            archive = zipfile.ZipFile(io.BytesIO(answer.read()))
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        text = archive.read(name).decode()
    return [
        line.split(":", 1)[1].strip()
        for line in text.splitlines()
        if line.startswith("Requires-Dist:")
    ]


def main() -> None:
    today = datetime.date.today().isoformat()
    lines = [
        "# Written by scripts/companions.py from each release's own metadata on PyPI",
        "# (Requires-Dist of the wheel named in `source`); do not edit by hand.",
        "schema: 1",
        "kind: companions",
        f'updated: "{today}"',
        "companions:",
    ]
    for package, (framework, oldest) in COMPANIONS.items():
        for version, (wheel, url, metadata) in sorted(_releases(package, oldest).items()):
            wanted = None
            for text in _requires_dist(url, metadata):
                requirement = Requirement(text)
                if requirement.name == framework and not requirement.marker:
                    wanted = str(requirement.specifier)
            requires = json.dumps(f"{framework}{wanted}") if wanted else "null"
            source = f"{wheel} METADATA Requires-Dist"
            if not wanted and package in RULES:
                rule, said = RULES[package]
                major, minor = version.release[:2]
                requires = json.dumps(rule.format(major=major, minor=minor, next=minor + 1))
                source = said.format(wheel=wheel)
            lines.append(
                f'  - {{package: {package}, version: "{version}", requires: {requires}, '
                f'source: "{source}"}}'
            )
            print(f"{package} {version}: {requires}", file=sys.stderr)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
