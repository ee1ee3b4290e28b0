# shellcheck shell=bash
# Service 'tester': gpuenv-tester and gpuenv-tester2, users who are not root, in the
# docker group, and a Python with gpuenv's dependencies that they can read (the tests
# install the checkout's gpuenv for it). Nothing runs, and `down` keeps them.
# Sourced by scripts/services.sh.

TESTER_USERS=(gpuenv-tester gpuenv-tester2)
# The distribution's interpreter: another user may not be able to read the one .venv
# was made from (pyenv's under /root), let alone a checkout in a private folder.
TESTER_PYTHON=/usr/bin/python3

# docker.io makes the docker group.
tester_packages() { echo dockerd:docker.io; }
tester_needs() { :; }

tester_deps() {  # what the tester's venv is made from: the hash of pyproject.toml
  sha256sum pyproject.toml | cut -d' ' -f1
}

tester_venv() {  # the venv for this checkout's dependencies
  local deps
  deps=$(tester_deps)
  # One venv per set of dependencies: checkouts with different pyproject.toml files (two
  # branches tested at once) never rebuild each other's.
  echo "$STATE/tester-venv-${deps:0:12}"
}

tester_users_up() {
  local user
  # A non-root user in the docker group: jobs and runs "as the submitting user" need one.
  # A second one: shared-server tests play one user against another (claims, locks).
  for user in "${TESTER_USERS[@]}"; do
    id "$user" >/dev/null 2>&1 ||
      useradd --system --create-home --shell /bin/bash --groups docker "$user"
  done
}

tester_python_up() {  # $TESTER_PYTHON, Python 3.11 or newer with venv
  if ! "$TESTER_PYTHON" -c 'import sys, ensurepip; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    log "installing python3 and python3-venv (apt) for the test user"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv >/dev/null
    "$TESTER_PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
      die "$TESTER_PYTHON is older than Python 3.11, which gpuenv needs"
  fi
}

tester_venv_up() {
  local venv want
  venv=$(tester_venv)
  want=$(tester_deps)
  if [ "$(cat "$venv/.gpuenv-deps" 2>/dev/null)" != "$want" ]; then
    log "making $venv: gpuenv's dependencies for the test user (pip)"
    rm -rf "$venv"
    "$TESTER_PYTHON" -m venv "$venv"
    # The build backend too, so that the tests can build gpuenv's wheel offline.
    "$TESTER_PYTHON" -c 'import tomllib
meta = tomllib.load(open("pyproject.toml", "rb"))
print("\n".join(meta["build-system"]["requires"] + meta["project"]["dependencies"]))' \
      >"$venv/requirements.txt"
    "$venv/bin/python" -m pip install -q -r "$venv/requirements.txt" ||
      die "installing gpuenv's dependencies into $venv failed"
    chmod -R a+rX "$venv"
    echo "$want" >"$venv/.gpuenv-deps"
  fi
  chmod a+rx "$STATE"
}

tester_up() {
  tester_users_up
  tester_python_up
  tester_venv_up
}

tester_down() {
  log "tester: the users and their Python are kept"
}

tester_status() {  # the users exist, and the venv for this checkout's dependencies
  local user
  for user in "${TESTER_USERS[@]}"; do
    id "$user" >/dev/null 2>&1 || return 1
  done
  [ "$(cat "$(tester_venv)/.gpuenv-deps" 2>/dev/null)" = "$(tester_deps)" ]
}
