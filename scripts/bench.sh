#!/usr/bin/env bash
# The benchmark command (`make bench`): the same services as the tests, Debian's
# docker-compose (a Python peer on docker-py) as a second baseline, then bench/bench.py.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/dev-env.sh
if ! command -v docker-compose >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "• installing docker-compose (apt) for the comparison" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null
fi
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
use_services
export GPUENV_REGISTRY_MIRROR=$GPUENV_TEST_REGISTRY
# Measure gpuenv as installed: with compiled bytecode, as pip leaves it.
unset PYTHONDONTWRITEBYTECODE
.venv/bin/python -m compileall -q gpuenv >/dev/null
.venv/bin/python bench/bench.py
