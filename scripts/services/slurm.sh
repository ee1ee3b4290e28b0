# shellcheck shell=bash
# Service 'slurm': a Slurm controller and node on this machine (cluster gpuenv-test,
# /etc/slurm/slurm.conf), four GPUs as GRES on stand-in device files (/dev/fakegpu0 to 3),
# whose jobs run containers on the 'gpu' engine. Also the helpers both clusters use
# (slurm-multi.sh). Sourced by scripts/services.sh.

slurm_packages() { echo slurmctld:slurm-wlm sbatch:slurm-client; }
slurm_needs() { echo munge; }

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

fake_gpus() {  # fake_gpus FIRST LAST: stand-in GPUs /dev/fakegpuFIRST..LAST (/dev/null's numbers)
  local n
  for n in $(seq "$1" "$2"); do
    [ -e "/dev/fakegpu$n" ] || mknod "/dev/fakegpu$n" c 1 3
  done
}

write_if_changed() {  # write_if_changed FILE: stdin into FILE, unless FILE holds it already
  cat >"$1.new"
  if cmp -s "$1.new" "$1"; then
    rm -f "$1.new"
  else
    mv "$1.new" "$1"
  fi
}

slurm_conf() {  # slurm.conf of gpuenv-test
  local host
  host=$(hostname -s)
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
}

slurm_up() {
  mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm "$RUN"
  fake_gpus 0 3
  slurm_conf | write_if_changed /etc/slurm/slurm.conf
  printf 'NodeName=%s Name=gpu File=/dev/fakegpu[0-3]\n' "$(hostname -s)" |
    write_if_changed /etc/slurm/gres.conf
  if ! alive "$RUN/slurmctld.pid"; then
    log "starting slurmctld"
    slurmctld
  fi
  if ! alive "$RUN/slurmd.pid"; then
    log "starting slurmd"
    slurmd
  fi
  wait_for 60 "the Slurm node (log: /var/log/slurm/)" sh -c "sinfo -h -o %T | grep -qE '^(idle|mixed|allocated)'"
  # Jobs left by an earlier test run that was interrupted hold GPUs for nothing; those of
  # test sessions still running (other checkouts share these clusters) are left alone.
  cancel_orphaned_test_jobs
}

slurm_down() {
  stop "$RUN/slurmd.pid" slurmd
  stop "$RUN/slurmctld.pid" slurmctld
}

slurm_status() {
  alive "$RUN/slurmctld.pid" && alive "$RUN/slurmd.pid"
}
