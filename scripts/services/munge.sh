# shellcheck shell=bash
# Service 'munge': munged, the authentication daemon both Slurm clusters (slurm.sh,
# slurm-multi.sh) use, with a key of its own in /etc/munge/munge.key, made once.
# Sourced by scripts/services.sh.

# munged runs as the munge user, which can write its pid file only in /run/munge.
MUNGED_PID=/run/munge/gpuenv-munged.pid

munge_packages() { echo munged:munge; }
munge_needs() { :; }

munge_key() {  # /etc/munge/munge.key, made once
  if [ ! -s /etc/munge/munge.key ]; then
    mungekey -c -f -k /etc/munge/munge.key >/dev/null 2>&1 ||
      dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  fi
}

munge_up() {
  mkdir -p /etc/munge /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
  munge_key
  if ! alive "$MUNGED_PID"; then
    log "starting munged"
    runuser -u munge -- munged --pid-file="$MUNGED_PID" --force
    wait_for 20 "munged" test -f "$MUNGED_PID"
  fi
}

munge_down() {
  stop "$MUNGED_PID" munged
}

munge_status() {
  alive "$MUNGED_PID"
}
