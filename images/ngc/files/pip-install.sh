#!/bin/sh
# Installs the project's Python dependencies (the files gpuenv wrote into the folder given
# first) with the image's own Python: install.py checks every pin against the image first
# (NVIDIA's builds and its pip constraint file are kept), then runs uv or pip.
#   pip-install.sh FOLDER [--cached] [--uv]
# --cached: /root/.cache is a cache mount (pip's and uv's caches below it), used when it
# is this build's user's alone (cache-ours.sh). --uv: uv, pinned in FOLDER/uv.txt, is
# installed for this step from the project's index through pip (its cache) and removed
# before the step ends, so no layer carries it; where it cannot be (no pip, an index
# without uv), pip installs the requirements.
# Arguments are passed as separate words (Dockerfile exec form): no shell parses them.
set -eu
# shellcheck source=images/ngc/files/cache-ours.sh
. /usr/local/lib/gpuenv/cache-ours.sh
if ! command -v python3 >/dev/null 2>&1; then
  echo "gpuenv: conflict: this image has no python3, so it cannot install Python requirements" \
    "(choose a framework image, or drop the requirements)" >&2
  exit 3
fi
folder=$1
shift
cached=
if [ "${1:-}" = --cached ]; then
  shift
  if cache_ours /root/.cache /root/.cache/pip /root/.cache/uv; then
    cached=--cached
  fi
fi
[ -n "$cached" ] || export PIP_NO_CACHE_DIR=1
uv=
if [ "${1:-}" = --uv ]; then
  shift
  if PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore PIP_NO_INPUT=1 \
    python3 -m pip install --quiet --no-deps --target /tmp/gpuenv-uv -r "$folder/uv.txt"; then
    uv=/tmp/gpuenv-uv/bin/uv
  else
    echo "gpuenv: uv could not be installed from the project's index: installing with pip"
  fi
fi
status=0
python3 /usr/local/lib/gpuenv/install.py "$folder" ${cached:+"$cached"} ${uv:+--uv "$uv"} || status=$?
rm -rf /tmp/gpuenv-uv
exit "$status"
