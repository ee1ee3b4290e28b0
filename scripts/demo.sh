#!/usr/bin/env bash
# The README's main command (`make demo`): gpuenv's job end to end on the example
# project, in a scratch copy so the repository stays clean.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/dev-env.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r examples/quickstart "$work/quickstart"
cd "$work/quickstart"
gpuenv=("$OLDPWD/.venv/bin/gpuenv")

echo "== gpuenv init (this host)" >&2
"${gpuenv[@]}" init --framework pytorch
echo "== gpuenv resolve --explain for a GeForce host with driver 535 (PyTorch 2.4 wanted)" >&2
"${gpuenv[@]}" resolve --version 2.4 --driver 535.104.05 --gpu "RTX 4090" || true
echo "== gpuenv lock --check" >&2
"${gpuenv[@]}" lock --check
echo "next: run \`gpuenv init\` in your own project, commit gpuenv.yaml and gpuenv.lock" >&2
