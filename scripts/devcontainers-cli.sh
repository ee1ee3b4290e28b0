#!/usr/bin/env bash
# Installs @devcontainers/cli, the Dev Containers tools' own client (what VS Code's
# extension runs), pinned, from npm into the test state folder (readable by the test
# users, who run it), once; prints the path of its `devcontainer` command. Used by
# scripts/test.sh for tests/integration/test_devcontainer.py.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

VERSION=0.89.0
dir=${GPUENV_TEST_STATE:-/var/lib/gpuenv-test}/devcontainers-cli-$VERSION
bin=$dir/node_modules/.bin/devcontainer
if ! [ -x "$bin" ]; then
  install_missing npm:npm
  rm -rf "$dir.partial"
  mkdir -p "$dir.partial"
  npm install --prefix "$dir.partial" --no-audit --no-fund --loglevel=error \
    "@devcontainers/cli@$VERSION" >&2
  chmod -R a+rX "$dir.partial"
  mv "$dir.partial" "$dir"
fi
echo "$bin"
