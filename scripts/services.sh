#!/usr/bin/env bash
# The real services the integration tests talk to, private to the test run. Each is a file
# in scripts/services/ with its own NAME_up, NAME_down and NAME_status (and the packages it
# installs and the services it needs running first):
#   netns          the network and mount namespaces the engines, the registry and Podman
#                  run in (loopback only: the host's interfaces, firewall, mounts and
#                  Docker engine stay untouched)
#   engine-gpu     a Docker engine with a stand-in NVIDIA hook on its PATH (`--gpus` works)
#   engine-nogpu   one without the hook, as on a host without the NVIDIA Container Toolkit
#   engine-claims  one with the hook, for the shared-server tests alone
#   engine-ports   one whose containers have a bridge network, for published ports (all
#                  in engine.sh)
#   registry       an OCI registry, reached as 127.0.0.1:5000 from the engines and the host
#   pypi           a package index of real wheels from PyPI, reached as 127.0.0.1:8099 from
#                  the engines' builds and the host, with a log of each request
#   docker-tcp     the 'gpu' engine over TCP on the host's loopback (127.0.0.1:23750)
#   images         the stand-in NGC images, built and pushed to the registry
#   munge          the authentication both Slurm clusters use
#   slurm          a Slurm controller and node with four GPUs as GRES
#   slurm-multi    a two-node Slurm cluster in two network namespaces of its own
#   tester         gpuenv-tester and gpuenv-tester2, and a Python they can read
#   podman         Podman, rootful and rootless (one per test user), with CDI
#
#   scripts/services.sh up|down|status [SERVICE...]
#
# `up` installs what is missing (apt), starts what is not running, in the order above,
# and waits until it answers; `down` stops what `up` started, by pid, in the reverse order.
# State that is slow to make (the debootstrap root, images, registry storage, the index's
# wheels, the tester's Python) is kept, so a second run is fast. `status` says which
# service runs, on stderr. Without SERVICEs they act on every service. `up` writes
# .cache/services.env for the tests; `down` of every service removes it.
set -euo pipefail
cd "$(dirname "$0")/.."

STATE=${GPUENV_TEST_STATE:-/var/lib/gpuenv-test}
RUN=${GPUENV_TEST_RUN:-/run/gpuenv-test}
REGISTRY=127.0.0.1:5000
ENV_FILE=.cache/services.env

# shellcheck source=scripts/lib.sh
. scripts/lib.sh
# shellcheck source=scripts/services/netns.sh
. scripts/services/netns.sh
# shellcheck source=scripts/services/engine.sh
. scripts/services/engine.sh
# shellcheck source=scripts/services/registry.sh
. scripts/services/registry.sh
# shellcheck source=scripts/services/pypi.sh
. scripts/services/pypi.sh
# shellcheck source=scripts/services/docker-tcp.sh
. scripts/services/docker-tcp.sh
# shellcheck source=scripts/services/images.sh
. scripts/services/images.sh
# shellcheck source=scripts/services/munge.sh
. scripts/services/munge.sh
# shellcheck source=scripts/services/slurm.sh
. scripts/services/slurm.sh
# shellcheck source=scripts/services/slurm-multi.sh
. scripts/services/slurm-multi.sh
# shellcheck source=scripts/services/tester.sh
. scripts/services/tester.sh
# shellcheck source=scripts/services/podman.sh
. scripts/services/podman.sh

# In the order `up` starts them: each after those it needs.
SERVICES=(netns engine-gpu engine-nogpu engine-claims engine-ports registry pypi docker-tcp images munge
  slurm slurm-multi tester podman)
# What `up` makes rather than starts: nothing of theirs runs and `down` keeps it. The
# status of every service leaves them out: it says whether there is anything for `down`
# to stop (use_services in lib.sh asks it before a test run, to stop at the end only what
# that run started), and a checkout whose stand-ins or pyproject.toml differ, with no
# images or Python of its own yet, must not take other checkouts' services for its own.
MADE=(images tester)
# Tools the tests run themselves, installed by `up` of every service: docker-compose (the
# benchmark's baseline), prometheus and its promtool (the exporter's tests start their
# own server), gcc (the scripted NVML, tests/nvml/), chromium and its chromedriver (the
# dashboard's page is loaded in a real browser, tests/integration/test_dashboard.py).
TEST_TOOLS=(docker-compose:docker-compose prometheus:prometheus promtool:prometheus gcc:gcc
  chromium:chromium chromedriver:chromium-driver)
EVERY=no  # yes: no SERVICE was named, the command is for every service

service_call() {  # service_call SERVICE ACTION: runs SERVICE's function for ACTION (up,
  # down, status, packages, needs); the engines' take the engine's name
  case "$1" in
    engine-*) "engine_$2" "${1#engine-}" ;;
    *) "${1//-/_}_$2" ;;
  esac
}

is_one_of() {  # is_one_of WORD LIST...
  local word=$1 item
  shift
  for item in "$@"; do
    [ "$item" != "$word" ] || return 0
  done
  return 1
}

check_names() {  # check_names SERVICE...: fails on a name that is not a service
  local service
  for service in "$@"; do
    is_one_of "$service" "${SERVICES[@]}" || die "no service '$service' (services: ${SERVICES[*]})"
  done
}


check_needs() {  # check_needs SERVICE...: what each SERVICE needs runs, or is one of them
  local service need
  for service in "$@"; do
    for need in $(service_call "$service" needs); do
      is_one_of "$need" "$@" || service_call "$need" status ||
        die "$service needs $need, which is not running: scripts/services.sh up $need $service"
    done
  done
}

install_packages() {  # install_packages SERVICE...: what the SERVICEs need, in one apt run
  local service words pairs=()
  for service in "$@"; do
    read -ra words <<<"$(service_call "$service" packages)"
    pairs+=("${words[@]}")
  done
  if [ "$EVERY" = yes ]; then
    pairs+=("${TEST_TOOLS[@]}")
  fi
  install_missing "${pairs[@]}"
}

env_file() {  # the tests' settings: where each service is
  # The engines have no bridge network (--bridge=none in a namespace of their own):
  # builds run their steps on the namespace's host network, its loopback, where the
  # registry and the package index answer (gpuenv's GPUENV_BUILD_NETWORK).
  cat <<ENV
GPUENV_BUILD_NETWORK=host
DOCKER_HOST=unix://$RUN/gpu.sock
GPUENV_TEST_DOCKER_NOGPU=unix://$RUN/nogpu.sock
GPUENV_TEST_DOCKER_CLAIMS=unix://$RUN/claims.sock
GPUENV_TEST_DOCKER_PORTS=unix://$RUN/ports.sock
GPUENV_TEST_DOCKER_TCP=tcp://$DOCKER_TCP
GPUENV_TEST_REGISTRY=$REGISTRY
GPUENV_TEST_INDEX=http://$PYPI/simple/
GPUENV_TEST_INDEX_LOG=$PYPI_ACCESS_LOG
GPUENV_TEST_NETNS=/proc/$(netns_pid)/ns/net
GPUENV_TEST_STATE=$STATE
GPUENV_TEST_STANDIN_TAGS="${STANDIN_TAGS[*]}"
GPUENV_TEST_SYNC_STANDIN_TAGS="${SYNC_STANDIN_TAGS[*]}"
GPUENV_TEST_DEPS_STANDIN_TAGS="${DEPS_STANDIN_TAGS[*]}"
GPUENV_TEST_TORCH_IMAGE=$TORCH_STANDIN
GPUENV_TEST_MULTI_SLURM_CONF=$MULTI_CONF
GPUENV_TEST_MULTI_NETNS=/run/netns/gpuenv-mn1
GPUENV_TEST_USER=gpuenv-tester
GPUENV_TEST_USER2=gpuenv-tester2
GPUENV_TEST_USER_PYTHON=$(tester_venv)/bin/python
GPUENV_TEST_PODMAN=unix://$RUN/podman.sock
GPUENV_TEST_PODMAN_PORTS=unix://$RUN/podman-ports.sock
GPUENV_TEST_PODMAN_ROOTLESS=unix://$RUN/podman-rootless/podman.sock
GPUENV_TEST_PODMAN_ROOTLESS2=unix://$RUN/podman-rootless2/podman.sock
GPUENV_TEST_PODMAN_TMP=$PODMAN/podman-tmp
GPUENV_TEST_PODMAN_ROOTLESS_TMP=$PODMAN/podman-rootless-tmp
GPUENV_TEST_CDI_DIR=$PODMAN/cdi
ENV
}

write_env_file() {  # .cache/services.env, while the namespaces run (it names their pid)
  if netns_status; then
    env_file >"$ENV_FILE.new"
    mv "$ENV_FILE.new" "$ENV_FILE"
    log "services ready ($ENV_FILE)"
  else
    log "$ENV_FILE not written: the services' namespaces (netns) do not run"
  fi
}

services_up() {  # services_up SERVICE...: in the order given
  local service
  need_root
  check_needs "$@"
  phase "packages the services need (apt, where missing)"
  install_packages "$@"
  mkdir -p "$STATE" "$RUN" .cache
  for service in "$@"; do
    phase "service $service"
    service_call "$service" up
  done
  write_env_file
  phases_report "times of the services' setup"
}

services_down() {  # services_down SERVICE...: in the reverse order
  local i
  for ((i = $#; i > 0; i--)); do
    service_call "${!i}" down
  done
  if [ "$EVERY" = yes ]; then
    rm -f "$ENV_FILE"
  fi
}

services_status() {  # services_status SERVICE...: one line a service on stderr; exit 0
  # when each runs (or is made). Of every service, only those that run count ($MADE).
  local service rc=0
  for service in "$@"; do
    if [ "$EVERY" = yes ] && is_one_of "$service" "${MADE[@]}"; then
      continue
    fi
    if service_call "$service" status; then
      echo "$service: up" >&2
    else
      echo "$service: down" >&2
      rc=1
    fi
  done
  return "$rc"
}

main() {
  local action=${1:-} services=() service
  [ $# -eq 0 ] || shift
  case "$action" in
    up | down | status) ;;
    *) die "usage: scripts/services.sh up|down|status [SERVICE...] (services: ${SERVICES[*]})" ;;
  esac
  check_names "$@"
  if [ $# -eq 0 ]; then
    EVERY=yes
    set -- "${SERVICES[@]}"
  fi
  for service in "${SERVICES[@]}"; do  # in the order of $SERVICES, whatever the order named
    if is_one_of "$service" "$@"; then
      services+=("$service")
    fi
  done
  "services_$action" "${services[@]}"
}

main "$@"
