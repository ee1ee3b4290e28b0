#!/bin/sh
# Installs the Python packages gpuenv.lock pins (the files gpuenv wrote into the folder given
# first) with the image's own Python: install.py --locked checks the base is the one the lock
# was resolved against, then runs uv or pip with hashes required and nothing resolved.
#   pip-install.sh FOLDER [--cached] [--uv]
# uv.txt pins uv by the sha256 of its wheels (pip checks them).
# --cached: /root/.cache is a cache mount (pip's and uv's caches below it), used when it
# is this build's user's alone (cache-ours.sh). --uv: uv, pinned in FOLDER/uv.txt, is
# installed from the project's index through pip: into the cache, where the next build
# finds it, or, without one, for this step only (removed before the step ends). No layer
# carries it. Where it cannot be installed (no pip, an index without uv), pip installs
# the requirements.
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
  if cache_ours /root/.cache /root/.cache/pip /root/.cache/uv /root/.cache/gpuenv-uv; then
    cached=--cached
  fi
fi
[ -n "$cached" ] || export PIP_NO_CACHE_DIR=1
install_uv() {
  PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore PIP_NO_INPUT=1 \
    python3 -m pip install --quiet --no-deps --only-binary :all: --target "$1" -r "$folder/uv.txt"
}
uv=
if [ "${1:-}" = --uv ]; then
  shift
  if [ -n "$cached" ]; then
    # uv kept in the cache for the next build, by what uv.txt asks (its version and
    # index); made in a folder of its own and renamed into place, so builds running at
    # once never see half of it.
    kept=/root/.cache/gpuenv-uv/$(cksum <"$folder/uv.txt" | cut -d' ' -f1)
    if ! "$kept/bin/uv" --version >/dev/null 2>&1; then
      rm -rf "$kept" "$kept.$$"
      if install_uv "$kept.$$"; then
        mv -T "$kept.$$" "$kept" 2>/dev/null || rm -rf "$kept.$$"
      fi
    fi
    if "$kept/bin/uv" --version >/dev/null 2>&1; then
      uv=$kept/bin/uv
    fi
  elif install_uv /tmp/gpuenv-uv; then
    uv=/tmp/gpuenv-uv/bin/uv
  fi
  [ -n "$uv" ] || echo "gpuenv: uv could not be installed from the project's index: installing with pip"
fi
status=0
python3 /usr/local/lib/gpuenv/install.py "$folder" --locked ${cached:+"$cached"} ${uv:+--uv "$uv"} || status=$?
rm -rf /tmp/gpuenv-uv
exit "$status"
