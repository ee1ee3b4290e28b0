#!/usr/bin/env bash
# Make .venv: a virtual environment with gpuenv (editable) and its dev tools.
# Idempotent and fast when nothing changed; installs python3-venv on Debian/Ubuntu
# when the interpreter lacks it.
set -euo pipefail
cd "$(dirname "$0")/.."

find_python() {
  for candidate in "${PYTHON:-}" python3.13 python3.12 python3.11 python3; do
    [ -n "$candidate" ] || continue
    if command -v "$candidate" >/dev/null 2>&1 &&
      "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

PY=$(find_python) || {
  echo "error: gpuenv needs Python 3.11 or newer (set PYTHON=/path/to/python3.11)" >&2
  exit 1
}

if [ ! -x .venv/bin/python ]; then
  if ! "$PY" -m venv .venv 2>/dev/null; then
    rm -rf .venv
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "• installing python3-venv (apt)" >&2
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
      "$PY" -m venv .venv
    else
      echo "error: '$PY -m venv' failed; install your distribution's python3-venv package" >&2
      exit 1
    fi
  fi
fi

stamp=.venv/.gpuenv-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "• installing gpuenv and its dev tools into .venv" >&2
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -e '.[dev]'
  echo "$want" >"$stamp"
fi
