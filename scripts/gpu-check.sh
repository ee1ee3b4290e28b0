#!/usr/bin/env bash
# The real-GPU check (docs/development/real-gpu.md): on a Linux machine with an NVIDIA
# driver and no Docker, install gpuenv from a folder of wheels (gpuenv's and its
# dependencies': no network needed) into a temporary venv, put the GPUs under a short
# load (a PyTorch matmul, where a Python with CUDA torch is found), and compare what
# gpuenv reads (doctor, resolve, top, the exporter) with nvidia-smi, in one table.
#
#   scripts/gpu-check.sh WHEELS_DIR
#
# Environment: PYTHON (3.11+, makes the venv; default python3), NVIDIA_SMI (default
# nvidia-smi), LOAD_PYTHON (the Python with torch for the load; default python3),
# LOAD_SECONDS (default 60). Exit 0: every reading agrees; 1: one does not; 2: the
# check could not run.
set -euo pipefail

wheels=${1:?usage: scripts/gpu-check.sh WHEELS_DIR (gpuenv and its dependencies as wheels)}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python=${PYTHON:-python3}
load_python=${LOAD_PYTHON:-python3}
load_seconds=${LOAD_SECONDS:-60}

work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
load_pid=""
cleanup() {
    if [[ -n $load_pid ]]; then
        kill "$load_pid" 2>/dev/null || true
        wait "$load_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

"$python" -m venv "$work/venv"
# Only the wheels given: no index, no pip config (a site's mirror must not fill gaps).
PIP_CONFIG_FILE=/dev/null "$work/venv/bin/python" -m pip install -q --no-index \
    --disable-pip-version-check --find-links "$wheels" gpuenv

# gpuenv's claims and records go to the temporary folder, not the machine's.
export GPUENV_STATE_DIR="$work/state"

if "$load_python" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    "$load_python" - "$load_seconds" <<'PY' &
import sys, time
import torch
end = time.monotonic() + float(sys.argv[1])
matrices = [torch.randn(8192, 8192, device=f"cuda:{i}") for i in range(torch.cuda.device_count())]
while time.monotonic() < end:
    for m in matrices:
        m @ m
    torch.cuda.synchronize()
PY
    load_pid=$!
    sleep 5 # the load reaches its clocks and power before anything is read
    echo "load: a PyTorch matmul on every GPU (pid $load_pid)"
else
    echo "load: none (no Python with CUDA torch at LOAD_PYTHON=$load_python): idle readings"
fi

"$work/venv/bin/python" "$here/gpu_check.py" --gpuenv "$work/venv/bin/gpuenv" \
    --nvidia-smi "${NVIDIA_SMI:-nvidia-smi}"
