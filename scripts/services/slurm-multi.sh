# shellcheck shell=bash
# Service 'slurm-multi': a second Slurm cluster, gpuenv-multi, for multi-node jobs: its
# controller and node mn1 in the network namespace gpuenv-mn1 (10.77.0.1), node mn2 in
# gpuenv-mn2 (10.77.0.2), joined by a veth pair made inside them: two "hosts" on their own
# private subnet, so that traffic between nodes (srun, a c10d rendezvous) crosses a real
# link and never touches this machine's interfaces. Debian's Slurm is built without
# --enable-multiple-slurmd, so two slurmd need two network namespaces. Mounts, munge and
# users are shared, as on a cluster with a shared file system. Clients use
# SLURM_CONF=$MULTI_CONF from gpuenv-mn1. The registry is forwarded into both namespaces.
# Uses slurm_conf_shared, fake_gpus and write_if_changed from slurm.sh.
# Sourced by scripts/services.sh.

MULTI_CONF=/etc/slurm-multi/slurm.conf
MULTI_NODES=(mn1:10.77.0.1 mn2:10.77.0.2)
IN_MN1=(nsenter --net=/run/netns/gpuenv-mn1)

slurm_multi_packages() {
  echo slurmctld:slurm-wlm sbatch:slurm-client ip:iproute2 nsenter:util-linux socat:socat
}
slurm_multi_needs() { echo munge registry; }

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

multi_netns_down() {
  local pair
  for pair in "${MULTI_NODES[@]}"; do
    [ ! -e "/run/netns/gpuenv-${pair%%:*}" ] || ip netns del "gpuenv-${pair%%:*}"
  done
}

slurm_multi_conf() {  # slurm.conf of gpuenv-multi
  local pair
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
}

slurm_multi_gres() {  # gres.conf of gpuenv-multi: two GPUs a node, after gpuenv-test's four
  local pair first=4
  for pair in "${MULTI_NODES[@]}"; do
    echo "NodeName=${pair%%:*} Name=gpu File=/dev/fakegpu[$first-$((first + 1))]"
    first=$((first + 2))
  done
}

slurm_multi_registry() {  # the nodes pull from the registry as 127.0.0.1:5000 too
  # (Apptainer on the batch host, enroot on every node)
  local pair name
  for pair in "${MULTI_NODES[@]}"; do
    name=${pair%%:*}
    forward "registry-$name" "$REGISTRY" "$REGISTRY_SOCKET" nsenter --net="/run/netns/gpuenv-$name"
    wait_for 30 "the registry, from gpuenv-$name (log: $RUN/registry-$name.log)" \
      registry_answers nsenter --net="/run/netns/gpuenv-$name"
  done
}

slurm_multi_up() {
  local pair name
  multi_netns_up
  mkdir -p "${MULTI_CONF%/*}" /var/spool/slurmctld-multi /var/log/slurm
  fake_gpus 4 $((4 + 2 * ${#MULTI_NODES[@]} - 1))
  slurm_multi_gres | write_if_changed "${MULTI_CONF%/*}/gres.conf"
  slurm_multi_conf | write_if_changed "$MULTI_CONF"
  if ! alive "$RUN/slurmctld-multi.pid"; then
    log "starting slurmctld of gpuenv-multi (in gpuenv-mn1)"
    "${IN_MN1[@]}" slurmctld -f "$MULTI_CONF"
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
    "${IN_MN1[*]} env SLURM_CONF=$MULTI_CONF sinfo -h -o '%D %T' | grep -qE '^2 (idle|mixed|allocated)'"
  slurm_multi_registry
  # Jobs left by an earlier test run that was interrupted (see slurm.sh).
  cancel_orphaned_test_jobs env SLURM_CONF="$MULTI_CONF" "${IN_MN1[@]}"
}

slurm_multi_down() {
  local pair name
  for pair in "${MULTI_NODES[@]}"; do
    name=${pair%%:*}
    stop "$RUN/registry-$name.pid" "the registry's forwarder for gpuenv-$name"
  done
  for pair in "${MULTI_NODES[@]}"; do
    name=${pair%%:*}
    stop "$RUN/slurmd-$name.pid" "slurmd $name"
  done
  stop "$RUN/slurmctld-multi.pid" "slurmctld of gpuenv-multi"
  multi_netns_down
}

slurm_multi_status() {
  local pair name
  alive "$RUN/slurmctld-multi.pid" || return 1
  for pair in "${MULTI_NODES[@]}"; do
    name=${pair%%:*}
    alive "$RUN/slurmd-$name.pid" || return 1
    alive "$RUN/registry-$name.pid" || return 1
  done
}
