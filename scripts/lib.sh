#!/usr/bin/env bash
# Shell helpers shared by scripts/services.sh and the services in scripts/services/, by
# scripts/test.sh and bench.sh (use_services: the services for one run) and scripts/demo.sh.
# Expects STATE and RUN to be set by the caller where a helper uses them.

log() { echo "• $*" >&2; }
die() { echo "error: $*" >&2; exit 1; }

# Where the time goes: `phase NAME` says NAME and starts timing it (ending the phase before);
# `phases_report` ends the last one and prints each phase's seconds on stderr.
PHASES=()
PHASE_NAME=""
PHASE_START=0
phase() {
  phase_end
  PHASE_NAME=$1
  PHASE_START=$(date +%s.%N)
  log "$1"
}
phase_end() {
  if [ -n "$PHASE_NAME" ]; then
    PHASES+=("$(awk -v a="$PHASE_START" -v b="$(date +%s.%N)" 'BEGIN { printf "%7.1fs", b - a }')  $PHASE_NAME")
    PHASE_NAME=""
  fi
}
phases_report() {  # phases_report TITLE
  phase_end
  if [ ${#PHASES[@]} -gt 0 ]; then
    echo "• $1:" >&2
    printf '  %s\n' "${PHASES[@]}" >&2
  fi
  PHASES=()
}

need_root() {
  [ "$(id -u)" = 0 ] || die "the test services need root (a Docker engine, apt): run 'sudo make test'"
}

install_missing() {  # install_missing COMMAND:PACKAGE...
  local missing=() pair
  for pair in "$@"; do
    command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || die "missing: ${missing[*]}: install them (apt) or run as root"
    log "installing ${missing[*]} (apt)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

alive() {  # the pid in file $1 is a running process, not a zombie waiting to be reaped
  local pid
  pid=$(cat "$1" 2>/dev/null) && kill -0 "$pid" 2>/dev/null &&
    [ "$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)" != Z ]
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local seconds=$1 what=$2
  shift 2
  for _ in $(seq "$((seconds * 4))"); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.25
  done
  die "$what did not come up within ${seconds}s"
}

registry_serve() {  # registry_serve tcp|unix ADDRESS [LAUNCHER...]: a registry on ADDRESS
  # (HOST:PORT or a socket's path), started through LAUNCHER (nsenter) if given; its pid in
  # $RUN/registry.pid, its storage in $STATE/registry
  local net=$1 addr=$2 pidfile="$RUN/registry.pid"
  shift 2
  if alive "$pidfile"; then
    return 0
  fi
  if [ "$net" = unix ]; then
    rm -f "$addr"
  fi
  mkdir -p "$STATE/registry"
  cat >"$STATE/registry.yml" <<YAML
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $STATE/registry
  delete:
    enabled: true
http:
  net: $net
  addr: $addr
YAML
  log "starting the registry on $addr"
  setsid "$@" docker-registry serve "$STATE/registry.yml" >"$RUN/registry.log" 2>&1 </dev/null &
  echo $! >"$pidfile"
  if [ "$net" = unix ]; then
    wait_for 30 "the registry (log: $RUN/registry.log)" test -S "$addr"
  else
    wait_for 30 "the registry (log: $RUN/registry.log)" \
      python3 -c "import urllib.request; urllib.request.urlopen('http://$addr/v2/', timeout=1)"
  fi
}

forward() {  # forward NAME HOST:PORT SOCKET [LAUNCHER...]: TCP HOST:PORT on the loopback of
  # the namespace LAUNCHER runs in (this one when none), to the unix SOCKET (socat); its pid
  # in $RUN/NAME.pid, its log in $RUN/NAME.log
  local name=$1 listen=$2 socket=$3 pidfile="$RUN/$1.pid"
  shift 3
  if alive "$pidfile"; then
    return 0
  fi
  setsid "$@" socat "TCP-LISTEN:${listen##*:},bind=${listen%:*},reuseaddr,fork" \
    "UNIX-CONNECT:$socket" >"$RUN/$name.log" 2>&1 </dev/null &
  echo $! >"$pidfile"
}

bookworm_rootfs() {  # a Debian bookworm root with Python 3 and pip, made once
  local rootfs="$STATE/rootfs-bookworm"
  if [ ! -x "$rootfs/usr/bin/python3" ]; then
    log "making a Debian bookworm root with Python 3 and pip (debootstrap, about a minute)"
    rm -rf "$rootfs"
    debootstrap --variant=minbase --include=python3,python3-pip bookworm "$rootfs" \
      http://deb.debian.org/debian >"$RUN/debootstrap.log" 2>&1 ||
      die "debootstrap failed (log: $RUN/debootstrap.log)"
    rm -rf "$rootfs/var/cache/apt/archives/"*.deb "$rootfs/var/lib/apt/lists/"*
  fi
  echo "$rootfs"
}

stop() {  # stop PIDFILE NAME
  local pidfile=$1 name=$2
  if alive "$pidfile"; then
    local pid
    pid=$(cat "$pidfile")
    log "stopping $name (pid $pid)"
    kill "$pid"
    for _ in $(seq 80); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  fi
  rm -f "$pidfile"
}

# What `make test` must leave as it found it: the host's interfaces, its firewall rules,
# and its own Docker engine (if one answers) able to start a container on its default
# bridge. A dockerd in the host's network namespace can break all three.
HOST_ENGINE=unix:///var/run/docker.sock
HOST_PROBE_IMAGE=gpuenv-test/host-probe:1

host_engine_probe() {
  local docker=(docker -H "$HOST_ENGINE") imported="" folder applet
  if ! timeout 20 "${docker[@]}" version >/dev/null 2>&1; then
    echo "no engine answers"
    return 0
  fi
  if ! "${docker[@]}" image inspect "$HOST_PROBE_IMAGE" >/dev/null 2>&1; then
    install_missing busybox:busybox-static
    folder=$(mktemp -d)
    mkdir -p "$folder/bin"
    cp "$(command -v busybox)" "$folder/bin/busybox"
    for applet in sh true; do ln -s busybox "$folder/bin/$applet"; done
    tar -C "$folder" -c . | "${docker[@]}" import - "$HOST_PROBE_IMAGE" >/dev/null
    rm -rf "$folder"
    imported=yes
  fi
  if timeout 60 "${docker[@]}" run --rm --network bridge "$HOST_PROBE_IMAGE" true >&2; then
    echo "starts a container on the default bridge"
  else
    echo "cannot start a container on the default bridge (its error is above)"
  fi
  if [ -n "$imported" ]; then
    "${docker[@]}" rmi "$HOST_PROBE_IMAGE" >/dev/null
  fi
}

host_state() {
  echo "## interfaces (ip -o link)"
  ip -o link
  local tool
  for tool in "${HOST_FIREWALL_TOOLS[@]}"; do
    echo "## $tool (without counters)"
    "$tool" 2>&1 | sed -e '/^#/d' -e 's/\[[0-9]*:[0-9]*\]//g'
  done
  echo "## the engine at $HOST_ENGINE"
  host_engine_probe
}

host_check_begin() {
  install_missing ip:iproute2
  HOST_FIREWALL_TOOLS=()
  local tool
  for tool in iptables-save ip6tables-save; do
    if command -v "$tool" >/dev/null; then HOST_FIREWALL_TOOLS+=("$tool"); fi
  done
  HOST_STATE_BEFORE=$(host_state)
}

host_check_end() {  # fails when the host's network or its Docker engine changed
  local after
  after=$(host_state)
  if [ "$after" != "$HOST_STATE_BEFORE" ]; then
    echo "error: the test services changed this host's network or its own Docker engine:" >&2
    diff -u --label before --label after <(echo "$HOST_STATE_BEFORE") <(echo "$after") >&2 || true
    return 1
  fi
  log "the host's interfaces, firewall rules and Docker engine are as they were"
}

services_exit() {  # the EXIT trap of use_services
  local rc=$?
  phases_report "times of make test's phases"
  if [ -n "$SERVICES_STARTED" ]; then
    scripts/services.sh down || rc=1
  fi
  host_check_end || rc=1
  exit "$rc"
}

use_services() {  # start the test services for this script and load their settings;
  # at exit, stop them only if this script started them (a developer's stay up), and
  # check that the host's network and Docker engine are as they were before
  need_root
  host_check_begin
  SERVICES_STARTED=""
  if ! scripts/services.sh status 2>/dev/null; then
    SERVICES_STARTED=yes
  fi
  trap services_exit EXIT
  scripts/services.sh up
  set -a
  # shellcheck disable=SC1091
  . .cache/services.env
  set +a
}

cancel_orphaned_test_jobs() {  # "$@": the prefix that reaches the cluster (none: the first)
  # Only the test suite's own jobs: gpuenv-tester's, named gpuenv-itest-* (`gpuenv submit`
  # of a make_project project), whose session is gone: the pid in .session-pid of the
  # project's base folder (tests/integration/conftest.py writes it) no longer runs.
  local id name workdir
  { "$@" squeue --noheader --user=gpuenv-tester --format='%i|%j|%Z' 2>/dev/null || true; } |
    while IFS='|' read -r id name workdir; do
      case "$name" in gpuenv-itest-*) ;; *) continue ;; esac
      alive "$(dirname "$workdir")/.session-pid" && continue
      log "cancelling Slurm job $id ($name): the test session that submitted it has ended"
      "$@" scancel "$id" 2>/dev/null || true
    done
}
