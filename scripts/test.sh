#!/usr/bin/env bash
# The README's test command (`make test`). On a fresh machine of this kind it sets up
# everything the tests need, runs lint, type checks and every test (unit and
# integration; none is skipped), and stops whatever it started.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

scripts/dev-env.sh

echo "• lint (ruff) and types (mypy --strict)" >&2
.venv/bin/ruff check gpuenv tests bench
.venv/bin/ruff format --check --quiet gpuenv tests bench
.venv/bin/mypy
echo "• architecture (import-linter contracts) and dead code (vulture)" >&2
.venv/bin/lint-imports --no-cache >/dev/null || .venv/bin/lint-imports --no-cache
.venv/bin/vulture gpuenv scripts/vulture_whitelist.py --min-confidence 60 \
  --ignore-decorators "@click.command,@click.group,@export.command"

echo "• shell scripts (shellcheck: scripts/, images/ and .ci/run)" >&2
install_missing shellcheck:shellcheck
mapfile -t shell_scripts <<<"$(find scripts images -name '*.sh' | sort)"
shellcheck -x -P scripts "${shell_scripts[@]}" .ci/run

echo "• docs (mkdocs build --strict: broken links, anchors and pages missing from nav fail)" >&2
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir .cache/site

echo "• test services (Docker engines, registry, stand-in NGC images)" >&2
use_services
echo "• @devcontainers/cli from npm (the editors' client the devcontainer tests drive)" >&2
GPUENV_TEST_DEVCONTAINER_CLI=$(scripts/devcontainers-cli.sh)
export GPUENV_TEST_DEVCONTAINER_CLI
echo "• the scripted NVML the tests load (tests/nvml/, gcc against NVIDIA's nvml.h)" >&2
tests/nvml/build.sh >/dev/null

# Integration tests fail (never skip) when a service does not answer.
export GPUENV_REQUIRE_DOCKER=1

echo "• tests (pytest: doctests, unit, integration)" >&2
.venv/bin/pytest --doctest-modules gpuenv tests "$@"
