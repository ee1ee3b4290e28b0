#!/usr/bin/env bash
# Shell helpers shared by scripts/services.sh (the test services) and scripts/demo.sh.
# Expects STATE, RUN and REGISTRY to be set by the caller.

log() { echo "• $*" >&2; }
die() { echo "error: $*" >&2; exit 1; }

need_root() {
  [ "$(id -u)" = 0 ] || die "the test services need root (a Docker engine, apt): run 'sudo make test'"
}

install_missing() {  # install_missing COMMAND:PACKAGE...
  local missing=() pair
  for pair in "$@"; do
    command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
  done
  if [ ${#missing[@]} -gt 0 ]; then
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

registry_up() {  # registry_up [LAUNCHER...]: a registry on $REGISTRY, or on the unix socket
  # $REGISTRY_SOCKET when the caller sets it; started through LAUNCHER (nsenter) if given
  local pidfile="$RUN/registry.pid" net=tcp addr=$REGISTRY
  if alive "$pidfile"; then
    return 0
  fi
  if [ -n "${REGISTRY_SOCKET:-}" ]; then
    net=unix addr=$REGISTRY_SOCKET
    rm -f "$REGISTRY_SOCKET"
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
    wait_for 30 "the registry (log: $RUN/registry.log)" test -S "$REGISTRY_SOCKET"
  else
    wait_for 30 "the registry (log: $RUN/registry.log)" \
      python3 -c "import urllib.request; urllib.request.urlopen('http://$REGISTRY/v2/', timeout=1)"
  fi
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

slurm_conf_shared() {  # the slurm.conf lines both test clusters share
  cat <<'CONF'
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
MpiDefault=none
SchedulerType=sched/backfill
CONF
}

slurm_up() {  # a Slurm controller and node on this machine, four GPUs as GRES
  local host conf=/etc/slurm/slurm.conf
  host=$(hostname -s)
  install_missing slurmctld:slurm-wlm munged:munge sbatch:slurm-client
  mkdir -p /etc/munge /run/munge /var/log/munge /var/lib/munge /etc/slurm \
    /var/spool/slurmctld /var/spool/slurmd /var/log/slurm "$RUN"
  chown munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
  if [ ! -s /etc/munge/munge.key ]; then
    mungekey -c -f -k /etc/munge/munge.key >/dev/null 2>&1 ||
      dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  fi
  # munged runs as the munge user, which can write its pid file only in /run/munge.
  if ! alive /run/munge/gpuenv-munged.pid; then
    log "starting munged"
    runuser -u munge -- munged --pid-file=/run/munge/gpuenv-munged.pid --force
    wait_for 20 "munged" test -f /run/munge/gpuenv-munged.pid
  fi
  for n in 0 1 2 3; do
    [ -e "/dev/fakegpu$n" ] || mknod "/dev/fakegpu$n" c 1 3
  done
  {
    printf 'ClusterName=gpuenv-test\nSlurmctldHost=%s\n' "$host"
    slurm_conf_shared
    cat <<CONF
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
JobAcctGatherType=jobacct_gather/none
NodeName=$host CPUs=$(nproc) RealMemory=2000 Gres=gpu:4 State=UNKNOWN
PartitionName=gpu Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
  } >"$conf.gpuenv"
  printf 'NodeName=%s Name=gpu File=/dev/fakegpu[0-3]\n' "$host" >/etc/slurm/gres.conf
  if ! cmp -s "$conf.gpuenv" "$conf"; then
    cp "$conf.gpuenv" "$conf"
  fi
  if ! alive "$RUN/slurmctld.pid"; then
    log "starting slurmctld"
    slurmctld
  fi
  if ! alive "$RUN/slurmd.pid"; then
    log "starting slurmd"
    slurmd
  fi
  wait_for 60 "the Slurm node (log: /var/log/slurm/)" sh -c "sinfo -h -o %T | grep -qE '^(idle|mixed|allocated)'"
}

# A second Slurm cluster, gpuenv-multi, for multi-node jobs: its controller and node mn1 in
# the network namespace gpuenv-mn1 (10.77.0.1), node mn2 in gpuenv-mn2 (10.77.0.2), joined
# by a veth pair made inside them: two "hosts" on their own private subnet, so that
# traffic between nodes (srun, a c10d rendezvous) crosses a real link and never touches
# this machine's interfaces. Debian's Slurm is built without --enable-multiple-slurmd, so
# two slurmd need two network namespaces. Mounts, munge and users are shared, as on a
# cluster with a shared file system. Clients use SLURM_CONF=$MULTI_CONF from gpuenv-mn1.
MULTI_CONF=/etc/slurm-multi/slurm.conf
MULTI_NODES=(mn1:10.77.0.1 mn2:10.77.0.2)

multi_netns_up() {  # the nodes' link is gpuenv0 on both, as nodes share interface names
  local pair name addr
  for pair in "${MULTI_NODES[@]}"; do
    name=gpuenv-${pair%%:*}
    [ -e "/run/netns/$name" ] || ip netns add "$name"
    ip -n "$name" link set lo up
  done
  if ! ip -n gpuenv-mn1 link show gpuenv0 >/dev/null 2>&1; then
    ip -n gpuenv-mn1 link add gpuenv0 type veth peer name gpuenv0 netns gpuenv-mn2
  fi
  for pair in "${MULTI_NODES[@]}"; do
    name=${pair%%:*} addr=${pair#*:}
    ip -n "gpuenv-$name" addr replace "$addr/24" dev gpuenv0
    ip -n "gpuenv-$name" link set gpuenv0 up
  done
}

slurm_multi_up() {
  local pair name addr dir=${MULTI_CONF%/*} gres=4
  multi_netns_up
  mkdir -p "$dir" /var/spool/slurmctld-multi
  {
    printf 'ClusterName=gpuenv-multi\nSlurmctldHost=%s(10.77.0.1)\n' "$(hostname -s)"
    slurm_conf_shared
    cat <<CONF
StateSaveLocation=/var/spool/slurmctld-multi
SlurmdSpoolDir=/var/spool/slurmd-%n
SlurmctldPidFile=$RUN/slurmctld-multi.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=/var/log/slurm/slurmctld-multi.log
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
JobAcctGatherType=jobacct_gather/none
CONF
    for pair in "${MULTI_NODES[@]}"; do
      echo "NodeName=${pair%%:*} NodeAddr=${pair#*:} CPUs=$(nproc) RealMemory=2000 Gres=gpu:2 State=UNKNOWN"
    done
    echo "PartitionName=multi Nodes=mn[1-2] Default=YES MaxTime=INFINITE State=UP"
  } >"$MULTI_CONF.new"
  : >"$dir/gres.conf.new"
  for pair in "${MULTI_NODES[@]}"; do
    name=${pair%%:*}
    for _ in 1 2; do
      [ -e "/dev/fakegpu$gres" ] || mknod "/dev/fakegpu$gres" c 1 3
      gres=$((gres + 1))
    done
    echo "NodeName=$name Name=gpu File=/dev/fakegpu[$((gres - 2))-$((gres - 1))]" >>"$dir/gres.conf.new"
  done
  mv "$dir/gres.conf.new" "$dir/gres.conf"
  if ! cmp -s "$MULTI_CONF.new" "$MULTI_CONF"; then
    mv "$MULTI_CONF.new" "$MULTI_CONF"
  else
    rm -f "$MULTI_CONF.new"
  fi
  if ! alive "$RUN/slurmctld-multi.pid"; then
    log "starting slurmctld of gpuenv-multi (in gpuenv-mn1)"
    nsenter --net=/run/netns/gpuenv-mn1 slurmctld -f "$MULTI_CONF"
  fi
  for pair in "${MULTI_NODES[@]}"; do
    name=${pair%%:*}
    if ! alive "$RUN/slurmd-$name.pid"; then
      log "starting slurmd $name (in gpuenv-$name)"
      mkdir -p "/var/spool/slurmd-$name"
      nsenter --net="/run/netns/gpuenv-$name" slurmd -f "$MULTI_CONF" -N "$name"
    fi
  done
  wait_for 60 "the gpuenv-multi nodes (log: /var/log/slurm/)" sh -c \
    "nsenter --net=/run/netns/gpuenv-mn1 env SLURM_CONF=$MULTI_CONF sinfo -h -o '%D %T' | grep -qE '^2 (idle|mixed|allocated)'"
}

slurm_multi_down() {
  local pair
  for pair in "${MULTI_NODES[@]}"; do
    stop "$RUN/slurmd-${pair%%:*}.pid" "slurmd ${pair%%:*}"
  done
  stop "$RUN/slurmctld-multi.pid" "slurmctld of gpuenv-multi"
  for pair in "${MULTI_NODES[@]}"; do
    [ ! -e "/run/netns/gpuenv-${pair%%:*}" ] || ip netns del "gpuenv-${pair%%:*}"
  done
}

slurm_down() {
  stop "$RUN/slurmd.pid" slurmd
  stop "$RUN/slurmctld.pid" slurmctld
  stop /run/munge/gpuenv-munged.pid munged
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
