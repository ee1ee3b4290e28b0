#!/bin/sh
# Installs the project's Python dependencies (the files gpuenv wrote into the folder given
# as the argument) with the image's own Python: install.py checks every pin against the
# image first (NVIDIA's builds and its pip constraint file are kept), then runs uv (when
# --uv names one that runs here) or pip. With --cached, their caches are cache mounts.
# Arguments are passed as separate words (Dockerfile exec form): no shell parses them.
set -eu
if ! command -v python3 >/dev/null 2>&1; then
  echo "gpuenv: conflict: this image has no python3, so it cannot install Python requirements" \
    "(choose a framework image, or drop the requirements)" >&2
  exit 3
fi
exec python3 /usr/local/lib/gpuenv/install.py "$@"
