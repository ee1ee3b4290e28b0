"""Spec + lock -> the Dockerfile and build context of the project image.

Everything is decided here; the templates in images/ngc only get values. User values
(package names, file names) are validated by the spec and reach the Dockerfile only as
JSON strings in exec-form instructions, so no shell ever parses them.

The image tag is content-addressed: a hash of the base digest, the Dockerfile and every
file of the context. Anything that does not change those (comments in gpuenv.yaml, the
GPUs it asks for) does not change the tag, and a second build finds the image.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import string
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from gpuenv import __version__
from gpuenv.common.labels import LABEL_PREFIX
from gpuenv.common.resources import data_dir
from gpuenv.errors import BuildError
from gpuenv.images.context import ContextFile, project_files
from gpuenv.images.registry import parse_reference
from gpuenv.project.spec import Spec
from gpuenv.resolution.lock import Lock, requirements_hashes

REQUIREMENTS_DIR = "/tmp/gpuenv/requirements"
_SAFE_PATH = re.compile(r"^[A-Za-z0-9._+-]+(/[A-Za-z0-9._+-]+)*$")


class _Template(string.Template):
    delimiter = "@"


def _template(name: str) -> _Template:
    return _Template((Path(data_dir("images")) / "ngc" / name).read_text(encoding="utf-8"))


@dataclass(frozen=True)
class BuildPlan:
    dockerfile: str  # what is built: FROM the reference this machine pulled
    canonical_dockerfile: str  # FROM the canonical name: what the tag hashes
    files: tuple[ContextFile, ...]
    tag: str
    labels: dict[str, str] = field(default_factory=dict)
    baked: bool = False

    def context(self) -> bytes:
        """The build context as an uncompressed tar: Dockerfile plus every file."""
        import tarfile

        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
            for name, data, mode, link in self._members():
                info = tarfile.TarInfo(name)
                info.mtime = 0
                info.mode = mode
                if link is not None:
                    info.type = tarfile.SYMTYPE
                    info.linkname = link
                    archive.addfile(info)
                else:
                    info.size = len(data)
                    archive.addfile(info, io.BytesIO(data))
        return buffer.getvalue()

    def _members(self) -> Iterator[tuple[str, bytes, int, str | None]]:
        yield "Dockerfile", self.dockerfile.encode(), 0o644, None
        for item in self.files:
            mode = 0o755 if item.executable else 0o644
            yield item.name, item.content() if item.link is None else b"", mode, item.link


def _json_args(values: Iterable[str]) -> str:
    return ", ".join(json.dumps(value) for value in values)


def base_reference(lock: Lock, pull_repository: str) -> str:
    """The FROM reference: by digest once the lock has one, else by tag."""
    reference = parse_reference(lock.image)
    if lock.digest:
        return f"{pull_repository}@{lock.digest}"
    return f"{pull_repository}:{reference.tag}"


def _requirement_files(spec: Spec) -> list[str]:
    files = [name for name, digest in requirements_hashes(spec).items() if digest != "missing"]
    for name in files:
        if not _SAFE_PATH.match(name):
            raise BuildError(
                f"requirements file '{name}' has characters gpuenv does not copy into images",
                hint="rename it using letters, digits, . _ + - and /",
            )
    return files


# The distributions an NGC image's framework build provides: a requirement on them would
# replace NVIDIA's CUDA build with a PyPI one (or fail), so gpuenv leaves them to the image.
FRAMEWORK_DISTRIBUTIONS = {
    "pytorch": {"torch"},
    "tensorflow": {"tensorflow", "tensorflow-gpu", "tensorflow-cpu", "tf-nightly"},
    "jax": {"jax", "jaxlib"},
}


def without_framework(text: str, framework: str) -> tuple[str, list[str]]:
    """Requirements text with the framework's own pins commented out, and those pins.

    >>> text, dropped = without_framework("numpy\\ntorch==2.4.0\\n", "pytorch")
    >>> dropped
    ['torch==2.4.0']
    >>> text.splitlines()[1]
    "# gpuenv: torch==2.4.0  (the image provides NVIDIA's build)"
    """
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    provided = FRAMEWORK_DISTRIBUTIONS.get(framework, set())
    kept, dropped = [], []
    for line in text.splitlines():
        requirement = line.split(" #", 1)[0].strip()
        name = None
        if requirement and not requirement.startswith(("#", "-")):
            with contextlib.suppress(InvalidRequirement):
                name = canonicalize_name(Requirement(requirement).name)
        if name in provided:
            kept.append(f"# gpuenv: {line.strip()}  (the image provides NVIDIA's build)")
            dropped.append(requirement)
        else:
            kept.append(line)
    return "\n".join(kept) + ("\n" if text.endswith("\n") else ""), dropped


def _support_files() -> list[ContextFile]:
    folder = Path(data_dir("images")) / "ngc" / "files"
    return [
        ContextFile(f"gpuenv/{path.name}", data=path.read_bytes(), executable=True)
        for path in sorted(folder.iterdir())
        if path.is_file()
    ]


def _dockerfile(base: str, canonical: str, steps: list[str]) -> str:
    return _template("Dockerfile.in").substitute(
        base=base, canonical=canonical, steps="".join(steps)
    )


def plan_build(
    spec: Spec, lock: Lock, *, pull_repository: str, bake: bool = False, lock_digest: str = ""
) -> BuildPlan:
    """Everything a build needs, decided: Dockerfile, context files, tag, labels."""
    files = _support_files()
    steps: list[str] = []
    if spec.apt:
        steps.append(_template("apt.in").substitute(packages=_json_args(spec.apt)))
    requirement_files = _requirement_files(spec)
    framework = str(lock.resolved.get("framework") or "none")
    if requirement_files:
        for name in requirement_files:
            path = os.path.join(spec.project_dir, name)
            text, dropped = without_framework(
                Path(path).read_text(encoding="utf-8", errors="replace"), framework
            )
            if dropped:
                version = lock.resolved.get("framework_version") or "its own build"
                steps.append(
                    _template("note.in").substitute(
                        text=f"{name}: {', '.join(dropped)} left to the image ({version})"
                    )
                )
            files.append(ContextFile(f"requirements/{name}", data=text.encode(), origin=path))
            steps.append(
                _template("copy.in").substitute(
                    source=json.dumps(f"requirements/{name}"),
                    target=json.dumps(f"{REQUIREMENTS_DIR}/{name}"),
                )
            )
        arguments: list[str] = []
        for name in spec.requirements:
            arguments += ["-r", f"{REQUIREMENTS_DIR}/{name}"]
        steps.append(_template("requirements.in").substitute(arguments=_json_args(arguments)))
    if spec.packages:
        steps.append(_template("packages.in").substitute(packages=_json_args(spec.packages)))
    if bake:
        files.extend(project_files(spec.project_dir))
        steps.append(_template("bake.in").substitute())

    reference = parse_reference(lock.image)
    canonical = base_reference(lock, reference.repository)
    dockerfile = _dockerfile(base_reference(lock, pull_repository), canonical, steps)
    canonical_dockerfile = _dockerfile(canonical, canonical, steps)

    digest = hashlib.sha256(b"gpuenv-image-v1\n" + canonical_dockerfile.encode())
    for item in sorted(files, key=lambda f: f.name):
        content = hashlib.sha256(item.content()).hexdigest()
        digest.update(f"\n{item.name}\0{item.executable}\0{item.link}\0{content}".encode())
    tag = f"gpuenv/{spec.name}:{digest.hexdigest()[:16]}"
    labels = {
        f"{LABEL_PREFIX}.project": spec.name,
        f"{LABEL_PREFIX}.project-dir": os.path.abspath(spec.project_dir),
        f"{LABEL_PREFIX}.lock": lock_digest,
        f"{LABEL_PREFIX}.version": __version__,
        f"{LABEL_PREFIX}.base": canonical,
        f"{LABEL_PREFIX}.baked": "true" if bake else "false",
    }
    # Labels go last, outside the hash: they describe the image, they are not its content.
    dockerfile += _template("labels.in").substitute(labels=_label_arguments(labels))
    return BuildPlan(dockerfile, canonical_dockerfile, tuple(files), tag, labels, bake)


def label_value(value: str) -> str:
    r"""A LABEL value in double quotes: Docker expands $VAR and reads backslashes there.

    >>> label_value('/home/ann/my "x" $HOME')
    '"/home/ann/my \\"x\\" \\$HOME"'
    """
    cleaned = " ".join(value.splitlines())
    escaped = cleaned.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
    return f'"{escaped}"'


def _label_arguments(labels: dict[str, str]) -> str:
    return " \\\n      ".join(
        f"{key}={label_value(value)}" for key, value in sorted(labels.items())
    )
