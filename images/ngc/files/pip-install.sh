#!/bin/sh
# Installs pip requirements given as arguments into an NGC image:
# - the image's own framework builds (NVIDIA's torch, tensorflow, jax...) are kept:
#   a requirement that would replace them fails instead of silently pulling a
#   different CUDA build from PyPI;
# - no pip cache is left in the layer.
# Arguments are passed as separate words (Dockerfile exec form): no shell parses them.
set -eu
keep=/tmp/gpuenv-keep-framework.txt
python3 -m pip list --format=freeze 2>/dev/null \
  | grep -iE '^(torch|torchvision|torchaudio|tensorflow|jax|jaxlib|triton)==' >"$keep" || true
PIP_BREAK_SYSTEM_PACKAGES=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
  PIP_ROOT_USER_ACTION=ignore PIP_NO_INPUT=1 \
  python3 -m pip install --constraint "$keep" "$@"
rm -f "$keep"
