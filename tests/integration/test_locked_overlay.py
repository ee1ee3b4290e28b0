"""gpuenv.lock pins every Python package a build installs, to the byte: against a real
package index (a private one per test, served by the test services' index server) and a
real engine. The index gains a release, swaps a file's bytes under the same name; the
lock holds, a clone builds what the lock says, and a file that is not the locked one is
refused."""

from __future__ import annotations

import base64
import datetime
import hashlib
import io
import os
import shutil
import subprocess
import sys
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from .conftest import RTX4090, docker

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
PYPI_SCRIPT = REPO / "scripts" / "services" / "pypi.py"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}\n"


class Index:
    """A PEP 503 index of its own under the test services' index root, served by the
    same server (scripts/services/pypi.py) at http://127.0.0.1:8099/tests/<id>/simple/."""

    def __init__(self, root: Path, url: str) -> None:
        self.root = root
        self.url = url
        (root / "wheels").mkdir(parents=True)

    def publish(
        self, project: str, version: str, value: str = "1", uploaded: str | None = None
    ) -> str:
        """A pure-Python wheel of `project` at `version` whose module says VALUE = value
        (other bytes under the same name when `value` differs), uploaded at `uploaded`
        (an ISO time; the index's JSON pages give it); its sha256."""
        module = project.replace("-", "_")
        info = f"{module}-{version}.dist-info"
        files = {
            f"{module}.py": f"VALUE = {value!r}\n".encode(),
            f"{info}/METADATA": (
                f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n"
            ).encode(),
            f"{info}/WHEEL": (
                b"Wheel-Version: 1.0\nGenerator: gpuenv tests\nRoot-Is-Purelib: true\n"
                b"Tag: py3-none-any\n"
            ),
        }
        record = f"{info}/RECORD"
        files[record] = (
            "".join(_record_line(n, d) for n, d in files.items()) + f"{record},,\n"
        ).encode()
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            for name, data in files.items():
                archive.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data)
        wheel = self.root / "wheels" / f"{module}-{version}-py3-none-any.whl"
        wheel.write_bytes(buffer.getvalue())
        if uploaded:
            moment = datetime.datetime.fromisoformat(uploaded.replace("Z", "+00:00"))
            os.utime(wheel, (moment.timestamp(), moment.timestamp()))
        subprocess.run([sys.executable, str(PYPI_SCRIPT), "index", str(self.root)], check=True)
        return hashlib.sha256(buffer.getvalue()).hexdigest()


@pytest.fixture
def index() -> Iterator[Index]:
    state = os.environ.get("GPUENV_TEST_STATE", "/var/lib/gpuenv-test")
    served = os.environ.get("GPUENV_TEST_INDEX", "")
    if not served:
        pytest.fail("no test package index: run `sudo scripts/services.sh up`", pytrace=False)
    name = uuid.uuid4().hex[:10]
    root = Path(state) / "pypi" / "tests" / name
    base = served.split("/simple/")[0]
    yield Index(root, f"{base}/tests/{name}/simple/")
    shutil.rmtree(root, ignore_errors=True)


def requirements(index: Index, *lines: str) -> str:
    """The private index first; the shared one for uv itself (the build installs it)."""
    shared = os.environ["GPUENV_TEST_INDEX"]
    return "\n".join([f"--index-url {index.url}", f"--extra-index-url {shared}", *lines]) + "\n"


def locked_packages(path: Path) -> dict[str, dict[str, str]]:
    data = yaml.safe_load((path / "gpuenv.lock").read_text())
    return {item["name"]: item for item in data["overlay"]["packages"]}


def installed(tag: str, project: str, docker_host: str) -> tuple[str, str]:
    """(version, VALUE) of `project` in the image `tag`."""
    module = project.replace("-", "_")
    code = (
        f"import importlib.metadata as m, {module}; print(m.version('{project}'), {module}.VALUE)"
    )
    out = docker("run", "--rm", tag, "python3", "-c", code, host=docker_host).stdout.split()
    return out[0], out[1]


def test_the_lock_holds_while_the_index_moves(make_project, index: Index, docker_host: str) -> None:
    """Lock and build take 1.0; the index gains 1.1; a clone in another folder finds its
    lock current and builds 1.0 still; --upgrade-package moves to 1.1 and says so."""
    package = f"gpuenv-locktest-{uuid.uuid4().hex[:6]}"
    first = index.publish(package, "1.0")
    project = make_project(requirements=requirements(index, package))
    pinned = locked_packages(project.path)[package]
    assert (pinned["version"], pinned["sha256"]) == ("1.0", first)
    assert pinned["index"] == index.url and pinned["url"].startswith(index.url.split("/simple/")[0])
    assert "resolved: true" in project.lock_text()
    tag = project.ok("build").stdout.strip()
    assert installed(tag, package, docker_host) == ("1.0", "1")

    index.publish(package, "1.1", value="2")
    clone = project.path.parent / f"clone-{uuid.uuid4().hex[:6]}"
    shutil.copytree(project.path, clone)
    cloned = type(project)(clone, project.env)
    checked = cloned.gpuenv("lock", "--check")
    assert checked.returncode == 0, checked.stderr
    again = cloned.ok("build", "--locked")
    assert again.stdout.strip() == tag  # one locked set, one tag, on every checkout
    docker("rmi", tag, host=docker_host)
    rebuilt = cloned.ok("build", "--locked").stdout.strip()
    assert rebuilt == tag and installed(tag, package, docker_host) == ("1.0", "1")

    moved = cloned.ok("lock", "--upgrade-package", package)
    assert f"~ {package} 1.0 → 1.1" in moved.stderr
    assert locked_packages(clone)[package]["version"] == "1.1"
    newer = cloned.ok("build", "--locked").stdout.strip()
    assert newer != tag and installed(newer, package, docker_host) == ("1.1", "2")


def test_a_file_swapped_under_the_same_name_is_refused(
    make_project, index: Index, docker_host: str
) -> None:
    package = f"gpuenv-swaptest-{uuid.uuid4().hex[:6]}"
    locked = index.publish(package, "1.0")
    project = make_project(requirements=requirements(index, package))
    assert locked_packages(project.path)[package]["sha256"] == locked
    served = index.publish(package, "1.0", value="tampered")  # same name, other bytes
    result = project.gpuenv("build")
    assert result.returncode == 12, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: a file differs from the one gpuenv.lock pins: {package}==1.0: the lock has "
        f"sha256:{locked}, the index served sha256:{served}"
    ]
    assert docker("images", "-q", f"gpuenv/{project.name}", host=docker_host).stdout.strip() == ""


def test_a_requirements_edit_re_resolves_minimally_and_says_so(
    make_project, index: Index, docker_host: str
) -> None:
    """Adding a requirement keeps what the lock had (1.0 of the first, though 1.1 is out
    now), adds the new one, and the build says it wrote the lock; --locked refuses."""
    first, second = (f"gpuenv-minimal-{uuid.uuid4().hex[:6]}" for _ in range(2))
    index.publish(first, "1.0")
    project = make_project(requirements=requirements(index, first))
    index.publish(first, "1.1", value="2")
    index.publish(second, "2.0")
    project.write("requirements.txt", requirements(index, first, second))
    refused = project.gpuenv("build", "--locked")
    assert refused.returncode == 5
    assert "requirements.txt changed since the Python packages were locked" in refused.stderr
    built = project.ok("build")
    assert "the Python packages are resolved again" in built.stderr
    assert f"+ {second} 2.0" in built.stderr and "commit gpuenv.lock" in built.stderr
    assert {k: v["version"] for k, v in locked_packages(project.path).items()} == {
        first: "1.0",
        second: "2.0",
    }
    assert installed(built.stdout.strip(), first, docker_host) == ("1.0", "1")
    project.ok("lock", "--check")


def test_a_hash_the_project_wrote_is_checked(make_project, index: Index) -> None:
    package = f"gpuenv-hashed-{uuid.uuid4().hex[:6]}"
    good = index.publish(package, "1.0")
    project = make_project(requirements=requirements(index, f"{package}==1.0 --hash=sha256:{good}"))
    assert locked_packages(project.path)[package]["sha256"] == good
    wrong = "0" * 64
    project.write("requirements.txt", requirements(index, f"{package}==1.0 --hash=sha256:{wrong}"))
    result = project.gpuenv("lock", *RTX4090)
    assert result.returncode == 3, result.stderr
    assert f"sha256:{good}" in result.stderr and "not a hash the project allows" in result.stderr


def test_export_pylock_installs_with_uv(make_project, docker_host: str) -> None:
    """`gpuenv export pylock` is a PEP 751 file a real client installs: uv (the version
    builds use, from the test index) installs exactly the locked set from it, on the base."""
    index = os.environ["GPUENV_TEST_INDEX"]
    project = make_project(requirements=f"--index-url {index}\ntabulate\nrequests>=2\n")
    exported = project.ok("export", "pylock", "-o", "pylock.toml")
    assert "wrote pylock.toml" in exported.stderr
    lock = yaml.safe_load(project.lock_text())
    registry = os.environ["GPUENV_TEST_REGISTRY"]
    base = f"{registry}/nvidia/pytorch@{lock['image']['digest']}"
    script = (
        f"python3 -m pip install -q --break-system-packages --target /tmp/uv --index-url {index} "
        "uv==0.13.9 && /tmp/uv/bin/uv pip install -q --system --break-system-packages "
        "-r /p/pylock.toml && python3 -m pip list --format=freeze"
    )
    frozen = docker(
        "run",
        "--rm",
        "--network",
        "host",
        "-v",
        f"{project.path}:/p:ro",
        base,
        "sh",
        "-c",
        script,
        host=docker_host,
    ).stdout.split()
    pinned = {f"{p['name']}=={p['version']}" for p in lock["overlay"]["packages"]}
    assert pinned and pinned <= {line.lower() for line in frozen}


def test_the_project_itself_is_installed_editable(make_project) -> None:
    """`-e .`: the project's own dependencies land in the lock, and its src/ package is
    importable in a run from any folder; an edit counts without a rebuild."""
    index = os.environ["GPUENV_TEST_INDEX"]
    project = make_project()
    project.write(
        "pyproject.toml",
        "[project]\nname = 'mypkg'\nversion = '0.1'\ndependencies = ['tabulate']\n",
    )
    (project.path / "src" / "mypkg").mkdir(parents=True)
    project.write("src/mypkg/__init__.py", "VALUE = 'first'\n")
    project.write("requirements.txt", f"--index-url {index}\n-e .\n")
    project.ok("lock", *RTX4090)
    assert "tabulate" in locked_packages(project.path)
    code = "import mypkg, tabulate; print(mypkg.VALUE)"
    ran = project.ok("run", "--gpus", "none", "--", "sh", "-c", f'cd / && python3 -c "{code}"')
    assert ran.stdout.strip() == "first"
    project.write("src/mypkg/__init__.py", "VALUE = 'edited'\n")
    again = project.ok("run", "--gpus", "none", "--", "sh", "-c", f'cd / && python3 -c "{code}"')
    assert again.stdout.strip() == "edited"


def test_lock_resolves_as_of_a_date(make_project, index: Index) -> None:
    """--exclude-newer resolves as of a date (pip's --uploaded-prior-to, from the index's
    upload times; the stand-in's pip 23 is too old, so pip 26.3 runs the resolution), and
    later re-locks keep the date."""
    package = f"gpuenv-dated-{uuid.uuid4().hex[:6]}"
    index.publish(package, "1.0", uploaded="2025-01-01T00:00:00Z")
    index.publish(package, "1.1", value="2", uploaded="2026-06-01T00:00:00Z")
    project = make_project(requirements=requirements(index, package))
    assert locked_packages(project.path)[package]["version"] == "1.1"
    dated = project.ok("lock", "--exclude-newer", "2026-01-01")
    assert f"~ {package} 1.1 → 1.0" in dated.stderr
    assert "as of 2026-01-01T00:00:00Z" in dated.stderr
    assert "exclude_newer: '2026-01-01T00:00:00Z'" in project.lock_text()
    again = project.ok("lock", "--upgrade-package", package)
    assert locked_packages(project.path)[package]["version"] == "1.0", again.stderr
    bad = project.gpuenv("lock", "--exclude-newer", "last year")
    assert bad.returncode == 2 and "is not a date" in bad.stderr
