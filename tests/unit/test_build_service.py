"""images.service.build against the fake engine: what a failed build says, and the build
that falls back to no cache mounts when the engine refuses one."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Generator, Iterable
from dataclasses import dataclass, field

import pytest

from gpuenv.engine.protocol import BuildCache, Event
from gpuenv.errors import BuildError
from gpuenv.images.inventory import dependency_caches
from gpuenv.images.progress import BuildProgress
from gpuenv.images.render import BuildPlan
from gpuenv.images.service import build
from tests.unit.fake_engine import FakeEngine

MOUNT = "--mount=type=cache,id=gpuenv-python-999,target=/root/.cache,sharing=shared "
PLAN = BuildPlan(
    dockerfile=f'FROM base\nRUN {MOUNT}["/bin/sh", "pip-install.sh", "--cached"]\n',
    canonical_dockerfile="",
    files=(),
    tag="gpuenv/demo:1",
    uncached='FROM base\nRUN ["/bin/sh", "pip-install.sh"]\n',
)
# Podman 4.3's buildah, rootless, after another user's build made /var/tmp/buildah-cache.
REFUSED = (
    'building at STEP "RUN --mount=type=cache,id=gpuenv-python-999,target=/root/.cache '
    '/bin/sh pip-install.sh --cached": resolving mountpoints for container "4d6a": unable '
    "to change uid,gid of cache directory: mkdir /var/tmp/buildah-cache/gpuenv-python-999: "
    "permission denied"
)


def dockerfile_of(context: Iterable[bytes]) -> str:
    with tarfile.open(fileobj=io.BytesIO(b"".join(context))) as archive:
        member = archive.extractfile("Dockerfile")
        assert member is not None
        return member.read().decode()


@dataclass
class ScriptedEngine(FakeEngine):
    """Builds as buildah does: each build's stream is the next script, and a script
    that ends without an error tags the image."""

    scripts: list[list[Event]] = field(default_factory=list)
    dockerfiles: list[str] = field(default_factory=list)

    def has_image(self, reference: str) -> bool:
        return reference in self.images_present

    def build(
        self, context: bytes, tag: str, *, network: str | None = None
    ) -> Generator[Event, None, None]:
        self.dockerfiles.append(dockerfile_of(context))
        script = self.scripts.pop(0)
        yield from script
        if not any("error" in event for event in script):
            self.images_present.add(tag)


class Recorder:
    def __init__(self) -> None:
        self.finished: list[BuildProgress] = []

    def build_started(self, tag: str) -> None:
        pass

    def build_lines(self, progress: BuildProgress, lines: list[str]) -> None:
        pass

    def build_finished(self, progress: BuildProgress) -> None:
        self.finished.append(progress)


STEP = {"stream": f'[1/1] STEP 2/2: RUN {MOUNT}["/bin/sh", "pip-install.sh", "--cached"]\n'}


def test_a_refused_cache_mount_builds_again_without_caches_and_warns_once() -> None:
    engine = ScriptedEngine(
        scripts=[
            [STEP, {"stream": REFUSED + "\n"}, {"error": REFUSED}],
            [{"stream": 'STEP 2/2: RUN ["/bin/sh", "pip-install.sh"]\n'}, {"stream": "ok\n"}],
        ]
    )
    view = Recorder()
    result = build(PLAN, engine, view)
    assert result.built and result.tag == PLAN.tag
    assert [("--mount" in text) for text in engine.dockerfiles] == [True, False]
    (warning,) = result.warnings
    assert "could not use gpuenv's dependency cache" in warning
    assert "(mkdir /var/tmp/buildah-cache/gpuenv-python-999: permission denied)" in warning, warning
    assert view.finished[0].warnings == [warning]  # the view says it, once


def test_another_failure_is_not_retried_and_names_the_requirement() -> None:
    failed = (
        "gpuenv: failed: no-such-package-gpuenv (requirements.txt:3): Because "
        "no-such-package-gpuenv was not found in the package registry"
    )
    engine = ScriptedEngine(scripts=[[STEP, {"stream": failed + "\n"}, {"error": "exit status 1"}]])
    with pytest.raises(BuildError) as raised:
        build(PLAN, engine, Recorder())
    assert len(engine.dockerfiles) == 1
    assert str(raised.value).startswith(
        "a requirement could not be installed: no-such-package-gpuenv (requirements.txt:3): "
    )
    assert "pip-install.sh" in (raised.value.step or "")


def test_a_plan_without_mounts_is_not_retried() -> None:
    plain = BuildPlan(
        dockerfile=PLAN.uncached, canonical_dockerfile="", files=(), tag="gpuenv/demo:2"
    )
    engine = ScriptedEngine(scripts=[[STEP, {"error": REFUSED}]])
    with pytest.raises(BuildError):
        build(plain, engine, Recorder())
    assert len(engine.dockerfiles) == 1


def test_gc_caches_sees_only_gpuenvs_cache_mounts() -> None:
    """BuildKit's records (GET /system/df), as Docker 20.10 gives them: gpuenv's are the
    mounts of its install steps, which run its scripts; the others are left alone."""
    records = [
        {
            "ID": "y8cz50h1jin47z34m7ea59036",
            "Type": "exec.cachemount",
            "Description": "cached mount /root/.cache from exec /bin/sh "
            "/usr/local/lib/gpuenv/pip-install.sh /tmp/gpuenv/requirements --cached",
            "InUse": False,
            "Size": 623087,
            "LastUsedAt": "2026-12-03T09:35:34.970067094Z",
        },
        {
            "ID": "icj8i6cwuq0iw2771r77bamlo",
            "Type": "exec.cachemount",
            "Description": "cached mount /cache from exec /bin/sh -c make",
            "InUse": False,
            "Size": 10,
        },
    ]
    engine = FakeEngine(caches=[BuildCache.from_record(row) for row in records])
    (mine,) = dependency_caches(engine) or []
    assert (mine.id, mine.size, mine.in_use) == ("y8cz50h1jin47z34m7ea59036", 623087, False)
    assert dependency_caches(FakeEngine(caches=None)) is None  # Podman: cannot list them


@pytest.mark.parametrize(
    ("step", "line", "said"),
    [
        (
            "RUN /usr/local/lib/gpuenv/apt-install.sh",
            "E: Failed to fetch http://deb.debian.org/debian/dists/bookworm/InRelease  "
            "Temporary failure resolving 'deb.debian.org'",
            "could not reach the network",
        ),
        (
            "RUN /usr/local/lib/gpuenv/pip-install.sh",
            "WARNING: Retrying ... Failed to establish a new connection: [Errno 111] "
            "Connection refused",
            "could not reach the network",
        ),
        (
            "RUN /usr/local/lib/gpuenv/apt-install.sh",
            "E: Unable to locate package libfoo-dev",
            "package names in `apt:`",
        ),
        (
            "RUN /usr/local/lib/gpuenv/pip-install.sh",
            "ERROR: No matching distribution found for nosuchpkg",
            "fix the requirement pip could not install",
        ),
    ],
)
def test_a_failed_step_is_hinted_by_what_failed_it(step: str, line: str, said: str) -> None:
    """A build step that could not reach the network is told so, not "check the package
    names" (the names were fine)."""
    from gpuenv.images.progress import BuildStep
    from gpuenv.images.service import _build_failure

    failed = BuildStep(step, started=True)
    failed.tail.append(line)
    progress = BuildProgress(steps=[failed], error="exit code: 100", failed=failed)
    assert said in (_build_failure(progress).hint or "")
