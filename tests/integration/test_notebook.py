"""`gpuenv notebook` starts a real JupyterLab (issue 34, item 2): installed from the test
package index on the stand-in image, on the 'ports' engine, whose published port is
reached from the services' namespace; its API answers with the token gpuenv printed,
and refuses without it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest

from tests.integration.conftest import GPUENV, containers, docker, gpuenv_failed, in_namespace

pytestmark = pytest.mark.integration

STATUS = """
import sys, time, urllib.error, urllib.request
for _ in range(120):
    try:
        with urllib.request.urlopen(sys.argv[1], timeout=3) as answer:
            print(answer.status, answer.read().decode()); break
    except urllib.error.HTTPError as exc:
        print(exc.code); break
    except OSError:
        time.sleep(0.5)
"""


def test_a_notebook_answers_with_its_token_and_only_with_it(
    make_project, ports_engine: str
) -> None:
    index = os.environ["GPUENV_TEST_INDEX"]
    project = make_project("gpus: none\n", requirements=f"--index-url {index}\njupyterlab\n")
    project.env["DOCKER_HOST"] = ports_engine
    project.ok("build", "-q")
    started = project.ok("notebook", "-d", SSH_CONNECTION="10.0.0.9 5022 10.0.0.5 22")
    name = started.stdout.strip()
    try:
        found = re.search(
            r"port 8888: (http://127\.0\.0\.1:(\d+)/)lab\?token=([\w-]+)", started.stderr
        )
        assert found, started.stderr
        base, port, token = found.group(1), found.group(2), found.group(3)
        assert f"ssh -L {port}:127.0.0.1:{port} " in started.stderr
        answer = in_namespace(STATUS, f"{base}api/status?token={token}")
        code, _, body = answer.stdout.strip().partition(" ")
        assert code == "200", answer.stdout + answer.stderr
        assert "started" in json.loads(body)
        refused = in_namespace(STATUS, f"{base}api/status")
        assert refused.stdout.strip() in ("403", "401"), refused.stdout
        listed = project.ok("ps", "--json").stdout
        assert name in listed and token not in listed  # the token is said once, to you
    finally:
        project.gpuenv("stop", name)
        project.gpuenv("rm", name)
    assert containers(ports_engine, project.name) == set()

    # Attached: Ctrl-C stops it at once (no terminal, so Jupyter does not ask), and
    # the container is gone.
    process = subprocess.Popen(
        [*GPUENV, "-C", str(project.path), "notebook"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=project.env,
    )
    assert process.stderr is not None
    said = ""
    deadline = time.monotonic() + 120
    while "port 8888: http" not in said and time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        said += line
    assert "port 8888: http" in said, said
    process.send_signal(signal.SIGINT)
    process.communicate(timeout=30)
    assert containers(ports_engine, project.name) == set()


def test_an_image_without_jupyterlab_is_told_the_line_to_add(
    make_project, ports_engine: str
) -> None:
    project = make_project("gpus: none\n")
    project.env["DOCKER_HOST"] = ports_engine
    project.ok("build", "-q")
    result = project.gpuenv("notebook")
    assert gpuenv_failed(result, 2), result.stderr
    assert "has no jupyterlab" in result.stderr
    assert "packages: [jupyterlab]" in result.stderr
    assert containers(ports_engine, project.name) == set()
    probes = docker("ps", "-aq", "--filter", "label=io.gpuenv.probe", host=ports_engine)
    assert probes.stdout.split() == []  # the question asked of the image left nothing
