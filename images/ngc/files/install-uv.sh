#!/bin/sh
# Installs uv, the installer gpuenv prefers, into its own folder of a build stage (the
# install step binds it; the image never carries it), from the same index options as the
# project's requirements (the file given). pip's cache is a cache mount: nothing of it
# lands in a layer. When uv cannot be installed here (no python3 or pip, an index without
# uv), the folder stays empty and the requirements are installed with pip.
# Arguments are passed as separate words (Dockerfile exec form): no shell parses them.
set -eu
requirements=$1
target=$2
mkdir -p "$target"
if ! command -v python3 >/dev/null 2>&1 || ! python3 -m pip --version >/dev/null 2>&1; then
  echo "gpuenv: this image has no python3 with pip: no uv; the requirements are installed with pip"
  exit 0
fi
if ! PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore PIP_NO_INPUT=1 \
  python3 -m pip install --quiet --no-deps --target "$target" -r "$requirements"; then
  rm -rf "$target"
  mkdir -p "$target"
  echo "gpuenv: uv could not be installed from the project's index: the requirements are installed with pip"
fi
