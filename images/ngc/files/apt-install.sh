#!/bin/sh
# Installs Debian packages given as arguments, leaving no package lists or archives in the
# layer. With --cached first, /var/cache/apt is a cache mount that outlives the build: the
# downloaded archives stay there, and so do the package lists (in gpuenv-lists below it,
# one mount for both), so a rebuild downloads only what changed. The base image's
# docker-clean rule, which deletes the archives, is set aside for this step only: the
# image's apt configuration is left as it was. A cache that is not this build's user's
# alone (cache-ours.sh) is not used.
# Arguments are passed as separate words (Dockerfile exec form): no shell parses them.
set -eu
# shellcheck source=images/ngc/files/cache-ours.sh
. /usr/local/lib/gpuenv/cache-ours.sh
if [ "${1:-}" = --cached ] && ! cache_ours /var/cache/apt; then
  # Not ours: nothing read from it or written to it; archives and lists in /tmp, removed.
  shift
  apt-get -o Dir::State::Lists=/tmp/gpuenv-apt/lists update
  DEBIAN_FRONTEND=noninteractive apt-get -o Dir::State::Lists=/tmp/gpuenv-apt/lists \
    -o Dir::Cache::Archives=/tmp/gpuenv-apt/archives install -y --no-install-recommends "$@"
  rm -rf /tmp/gpuenv-apt
  exit 0
fi
if [ "${1:-}" != --cached ]; then
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"
  apt-get clean
  rm -rf /var/lib/apt/lists/*
  exit 0
fi
shift
lists=/var/cache/apt/gpuenv-lists
mkdir -p "$lists/partial"
clean=/etc/apt/apt.conf.d/docker-clean
if [ -e "$clean" ]; then
  mv "$clean" /tmp/gpuenv-docker-clean
  trap 'mv /tmp/gpuenv-docker-clean "$clean"' EXIT
fi
apt-get -o "Dir::State::Lists=$lists" update
DEBIAN_FRONTEND=noninteractive apt-get -o "Dir::State::Lists=$lists" \
  -o APT::Keep-Downloaded-Packages=true install -y --no-install-recommends "$@"
