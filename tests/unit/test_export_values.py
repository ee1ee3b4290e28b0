"""`gpuenv export` of a pushed project, through the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from gpuenv.cli import main

from ..conftest import reseal

SECRET = "s3cret-token-value"
FROM_FILE = "file-only-value"


@pytest.fixture
def pushed_project(tmp_path: Path) -> Path:
    """A locked project with a push recorded (as `gpuenv push` writes it)."""
    (tmp_path / "requirements.txt").write_text("torch==2.4.0\n")
    (tmp_path / "job.py").write_text("print('hi')\n")
    assert run(tmp_path, "init", "--driver", "550.54.15", "--gpu", "RTX 4090").exit_code == 0
    spec_file = tmp_path / "gpuenv.yaml"
    spec_file.write_text(spec_file.read_text().replace("env: {}", "env:\n  LOG_LEVEL: info"))
    assert run(tmp_path, "lock", "--driver", "550.54.15", "--gpu", "RTX 4090").exit_code == 0
    lock = tmp_path / "gpuenv.lock"
    digest = "c" * 64
    lock.write_text(
        lock.read_text()
        + f"pushed:\n  reference: r/x:1\n  digest: sha256:{digest}\n  image: r/x@sha256:{digest}\n"
    )
    reseal(lock)
    (tmp_path / "run.env").write_text(f"FROM_FILE={FROM_FILE}\n")
    return tmp_path


def run(project: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["-C", str(project), *args], catch_exceptions=False)


def test_compose_exports_the_pushed_image(pushed_project: Path) -> None:
    result = run(pushed_project, "export", "compose", "job.py")
    assert result.exit_code == 0, result.output
    (service,) = yaml.safe_load(result.stdout)["services"].values()
    assert service["image"] == "r/x@sha256:" + "c" * 64
