#!/bin/sh
# Installs Debian packages given as arguments, leaving no package lists in the layer.
# Arguments are passed as separate words (Dockerfile exec form): no shell parses them.
set -eu
apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"
apt-get clean
rm -rf /var/lib/apt/lists/*
