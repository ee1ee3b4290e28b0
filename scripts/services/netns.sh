# shellcheck shell=bash
# Service 'netns': the network and mount namespaces the engines, the registry, the package
# index and Podman run in, with only a loopback interface: they cannot touch the host's
# interfaces (a --bridge=none dockerd deletes the docker0 of the namespace it runs in),
# its firewall, its mounts or its Docker engine. Clients reach the engines over their
# unix sockets.
# Sourced by scripts/services.sh.

# The services' namespaces live as long as a sleeping process that holds them (its pid
# in $NETNS_PID); everything else enters them with nsenter.
NETNS_PID=$RUN/netns.pid
# The services that run inside them, in the order they stop.
NETNS_RESIDENTS=(podman pypi registry engine-ports engine-claims engine-nogpu engine-gpu)

netns_packages() { echo ip:iproute2 nsenter:util-linux; }
netns_needs() { :; }

netns_pid() {  # the pid of the process that holds the namespaces
  cat "$NETNS_PID"
}

netns_ready() {
  local pid
  pid=$(cat "$NETNS_PID" 2>/dev/null) || return 1
  [ "$(readlink "/proc/$pid/ns/net")" != "$(readlink /proc/self/ns/net)" ] &&
    [ "$(readlink "/proc/$pid/ns/mnt")" != "$(readlink /proc/self/ns/mnt)" ] &&
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = sleep ]
}

netns_status() {
  alive "$NETNS_PID" && netns_ready
}

netns_residents_down() {
  local service
  for service in "${NETNS_RESIDENTS[@]}"; do
    service_call "$service" down
  done
}

netns_up() {
  if netns_status; then
    return 0
  fi
  # What still runs was started in namespaces that are gone: the registry there
  # cannot be reached from new ones.
  netns_residents_down
  stop "$NETNS_PID" "the services' namespaces"
  log "making the services' own network namespace (loopback only) and mount namespace"
  # containerd's shims keep their sockets in /run/containerd/s whatever the engine's
  # exec root: a tmpfs there keeps them apart from the host's containerd.
  mkdir -p /run/containerd
  setsid unshare --net --mount --propagation private -- sh -c \
    'ip link set lo up && mount -t tmpfs -o mode=0711 gpuenv-test /run/containerd && exec sleep infinity' \
    >"$RUN/netns.log" 2>&1 </dev/null &
  echo $! >"$NETNS_PID"
  wait_for 10 "the services' namespaces (log: $RUN/netns.log)" netns_ready
}

netns_down() {
  # What runs inside stops first: once the holder is gone, nothing can enter the
  # namespaces to reach it, and the next `up` makes new ones.
  netns_residents_down
  stop "$NETNS_PID" "the services' namespaces"
}
