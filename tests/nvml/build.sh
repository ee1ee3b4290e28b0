#!/usr/bin/env bash
# Build the scripted NVML (tests/nvml/scripted_nvml.c) into .cache/nvml/libnvidia-ml.so.1
# against NVIDIA's nvml.h from the dev dependency nvidia-nvml-dev (in .venv). Does nothing
# when the library is newer than its source and the header. Prints the folder to put on
# LD_LIBRARY_PATH.
set -euo pipefail
cd "$(dirname "$0")/../.."

src=tests/nvml/scripted_nvml.c
out=.cache/nvml
lib=$out/libnvidia-ml.so.1
header=$(ls .venv/lib/python3*/site-packages/nvidia/*/include/nvml.h 2>/dev/null | head -n1 || true)
if [ -z "$header" ]; then
  echo "error: nvml.h not found: install the dev dependencies (scripts/dev-env.sh installs nvidia-nvml-dev)" >&2
  exit 1
fi
if [ ! -f "$lib" ] || [ "$src" -nt "$lib" ] || [ "$header" -nt "$lib" ]; then
  command -v "${CC:-gcc}" >/dev/null || { echo "error: no C compiler (${CC:-gcc}) to build the scripted NVML" >&2; exit 1; }
  mkdir -p "$out"
  "${CC:-gcc}" -std=c11 -D_GNU_SOURCE -O1 -Wall -Wextra -Werror -shared -fPIC \
    -I"$(dirname "$header")" -Wl,-soname,libnvidia-ml.so.1 -o "$lib.tmp" "$src"
  mv "$lib.tmp" "$lib"
fi
echo "$PWD/$out"
