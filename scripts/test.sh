#!/usr/bin/env bash
# The README's test command (`make test`). On a fresh machine of this kind it sets up
# everything the tests need, runs lint, type checks and every test (unit and
# integration; none is skipped), and stops whatever it started.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

phase "the development environment (.venv: pip)"
scripts/dev-env.sh

phase "lint (ruff) and types (mypy --strict)"
.venv/bin/ruff check gpuenv tests bench
.venv/bin/ruff format --check --quiet gpuenv tests bench
.venv/bin/mypy
phase "architecture (import-linter contracts) and dead code (vulture)"
.venv/bin/lint-imports --no-cache >/dev/null || .venv/bin/lint-imports --no-cache
.venv/bin/vulture gpuenv scripts/vulture_whitelist.py --min-confidence 60 \
  --ignore-decorators "@click.command,@click.group,@export.command"

phase "shell scripts (shellcheck: scripts/, images/ and .ci/run)"
install_missing shellcheck:shellcheck
mapfile -t shell_scripts <<<"$(find scripts images -name '*.sh' | sort)"
shellcheck -x -P scripts "${shell_scripts[@]}" .ci/run

phase "docs (mkdocs build --strict: broken links, anchors and pages missing from nav fail)"
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir .cache/site

phase "test services (Docker engines, registry, stand-in NGC images)"
use_services
phase "@devcontainers/cli from npm (the editors' client the devcontainer tests drive)"
GPUENV_TEST_DEVCONTAINER_CLI=$(scripts/devcontainers-cli.sh)
export GPUENV_TEST_DEVCONTAINER_CLI
phase "the scripted NVML the tests load (tests/nvml/, gcc against NVIDIA's nvml.h)"
tests/nvml/build.sh >/dev/null

# Integration tests fail (never skip) when a service does not answer.
export GPUENV_REQUIRE_DOCKER=1

if [ "$#" -gt 0 ]; then  # the tests asked for, one at a time
  phase "tests (pytest $*)"
  .venv/bin/pytest --doctest-modules --durations=15 "$@"
else
  # Doctests and unit tests touch no service: they share nothing and run on every core.
  phase "doctests and unit tests (pytest -n auto: on every core; the slowest listed)"
  .venv/bin/pytest -n auto --doctest-modules --durations=10 gpuenv tests/unit
  # Integration tests share the services (GPUs, claims, Slurm): one at a time.
  phase "integration tests (pytest, one at a time; the slowest listed)"
  .venv/bin/pytest --durations=15 tests/integration
fi
