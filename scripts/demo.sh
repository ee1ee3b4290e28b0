#!/usr/bin/env bash
# The README's main command (`make demo`): gpuenv's main job end to end, on a fresh
# machine too. Installs gpuenv into .venv, makes sure a Docker engine runs (installs and
# starts one on Debian/Ubuntu where missing, and says so), then, in a scratch copy of
# examples/quickstart, runs `gpuenv init` and `gpuenv run train.py`.
# Where nvcr.io cannot be reached (air-gapped machines, these test machines), the NGC
# PyTorch image is replaced, through gpuenv's registry mirror, by a locally built
# stand-in: Debian bookworm + Python 3.11 + the PyTorch 2.13.0 CPU wheel. It says so.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
STATE=${GPUENV_TEST_STATE:-/var/lib/gpuenv-test}
RUN=/run/gpuenv-demo
REGISTRY=127.0.0.1:5000
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

say() { printf '\n\033[1m== %s\033[0m\n' "$*" >&2; }

started=()
work=""
cleanup() {
  local item
  for item in "${started[@]}"; do stop "${item%%|*}" "${item#*|}"; done
  [ -n "$work" ] && rm -rf "$work"
}
trap cleanup EXIT

say "installing gpuenv into .venv"
scripts/dev-env.sh
GPUENV=("$REPO/.venv/bin/gpuenv")
mkdir -p "$RUN"

export DOCKER_HOST=${DOCKER_HOST:-unix:///var/run/docker.sock}
if docker info >/dev/null 2>&1; then
  say "using the Docker engine at $DOCKER_HOST"
else
  if [ "$(id -u)" != 0 ] || [ "$DOCKER_HOST" != unix:///var/run/docker.sock ]; then
    die "no Docker engine answers at $DOCKER_HOST: start it (sudo systemctl start docker) and run make demo again"
  fi
  command -v apt-get >/dev/null || die "no Docker engine here; install Docker, start it, and run make demo again"
  install_missing dockerd:docker.io
  say "no Docker engine was running: starting dockerd for the demo (stopped again at the end)"
  setsid dockerd --pidfile "$RUN/dockerd.pid" >"$RUN/dockerd.log" 2>&1 </dev/null &
  started+=("$RUN/dockerd.pid|dockerd")
  wait_for 60 "dockerd (log: $RUN/dockerd.log)" docker info
fi

work=$(mktemp -d)
cp -r examples/quickstart "$work/quickstart"
cd "$work/quickstart"

if python3 - <<'PY'
import sys, urllib.error, urllib.request
try:
    urllib.request.urlopen("https://nvcr.io/v2/", timeout=5)
except urllib.error.HTTPError:
    sys.exit(0)  # 401: the registry answers
except Exception:
    sys.exit(1)
PY
then
  say "nvcr.io is reachable: gpuenv will pull NVIDIA's real NGC image (several GB)"
else
  say "nvcr.io is not reachable from this machine"
  cat >&2 <<'TEXT'
gpuenv pulls nvcr.io images through a registry mirror here (GPUENV_REGISTRY_MIRROR).
The image behind it is a STAND-IN built on this machine, NOT NVIDIA's NGC image:
Debian bookworm + Python 3.11 + the PyTorch 2.13.0 CPU wheel. gpuenv.lock still names
the NGC image it resolved, with the stand-in's digest.
TEXT
  install_missing docker-registry:docker-registry debootstrap:debootstrap
  mkdir -p "$STATE"
  if ! python3 -c "import urllib.request; urllib.request.urlopen('http://$REGISTRY/v2/', timeout=2)" 2>/dev/null; then
    registry_serve tcp "$REGISTRY"
    started+=("$RUN/registry.pid|registry")
  fi
  export GPUENV_REGISTRY_MIRROR=$REGISTRY
fi

say "gpuenv init (in a scratch copy of examples/quickstart: $work/quickstart)"
"${GPUENV[@]}" init

image=$(awk '/reference:/ {print $2; exit}' gpuenv.lock)
if [ -n "${GPUENV_REGISTRY_MIRROR:-}" ]; then
  standin="$REGISTRY/${image#nvcr.io/}"
  if ! docker image inspect "$standin" >/dev/null 2>&1; then
    say "building the stand-in for $image (once; a minute or two)"
    base=gpuenv-demo/bookworm-python:1
    if ! docker image inspect "$base" >/dev/null 2>&1; then
      rootfs=$(bookworm_rootfs)
      tar -C "$rootfs" -c . | docker import - "$base" >/dev/null
    fi
    context="$work/standin"
    mkdir -p "$context/wheels"
    "$REPO/.venv/bin/python" -m pip download -q -d "$context/wheels" torch==2.13.0 numpy 2>/dev/null
    cat >"$context/Dockerfile" <<DOCKERFILE
FROM $base
COPY wheels /tmp/wheels
RUN PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-cache-dir --no-index \
      --find-links /tmp/wheels torch==2.13.0 numpy && rm -rf /tmp/wheels
ENV NVIDIA_VISIBLE_DEVICES=all
LABEL io.gpuenv.stand-in="$image: Debian bookworm + Python 3.11 + PyTorch 2.13.0 CPU, not NVIDIA's image"
DOCKERFILE
    docker build -q -t "$standin" "$context" >/dev/null 2>&1 || die "building the stand-in failed"
  fi
  docker push -q "$standin" >/dev/null
fi

gpus=()
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  say "gpuenv run train.py (on this machine's NVIDIA GPUs)"
else
  say "gpuenv run --gpus optional train.py (no NVIDIA GPU here: it runs on the CPU)"
  gpus=(--gpus optional)
fi
"${GPUENV[@]}" run "${gpus[@]}" train.py --steps 300

say "done"
cat >&2 <<'TEXT'
What happened: gpuenv read the torch pin in requirements.txt, chose the newest NGC image
that fits it and this host, pinned it in gpuenv.lock (with its digest), built the
project image on top of it, and ran train.py in it as you, with the project mounted at
/workspace (the checkpoint it wrote is yours).

Next, in your own project:
    cd your-project
    gpuenv init              # writes gpuenv.yaml and gpuenv.lock; commit both
    gpuenv run train.py      # or: gpuenv run -- bash -lc '...'; gpuenv shell
TEXT
