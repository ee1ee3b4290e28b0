#!/bin/sh
# Installs Debian packages given as arguments, leaving no package lists or archives in the
# layer. With --cached first, /var/cache/apt and /var/lib/apt/lists are cache mounts that
# outlive the build: the downloaded archives are kept there (the base images' docker-clean
# rule that deletes them is turned off), and a rebuild downloads only what changed.
# Arguments are passed as separate words (Dockerfile exec form): no shell parses them.
set -eu
cached=
if [ "${1:-}" = --cached ]; then
  cached=1
  shift
  rm -f /etc/apt/apt.conf.d/docker-clean
  echo 'Binary::apt::APT::Keep-Downloaded-Packages "true";' >/etc/apt/apt.conf.d/gpuenv-keep-cache
fi
apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"
if [ -z "$cached" ]; then
  apt-get clean
  rm -rf /var/lib/apt/lists/*
fi
