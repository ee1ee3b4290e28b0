# shellcheck shell=bash
# Services 'engine-gpu', 'engine-nogpu', 'engine-claims' and 'engine-ports': Docker engines
# (dockerd), each
# on its own socket ($RUN/NAME.sock), data root and exec root, in the services' namespaces
# (see netns.sh). Each function takes the engine's NAME: gpu, nogpu or claims.
#   - gpu: a stand-in NVIDIA hook on its PATH, so `--gpus` requests reach the daemon's
#     nvidia device driver (see shared/notes/test-infrastructure.md);
#   - nogpu: without the hook, as on a host without the NVIDIA Container Toolkit;
#   - claims: with the hook, the shared-server tests' own engine: their runs live for
#     seconds, and a test session that starts elsewhere clears gpuenv's containers from
#     the engines it uses (conftest clear_leftovers);
#   - ports: without the hook, the one engine whose containers have a network: a bridge
#     of its own ($PORTS_BRIDGE, made in the namespace: the others' --bridge=none deletes
#     docker0), so published ports reach them through docker-proxy on the namespace's
#     loopback. No iptables rules, no masquerading: nothing leaves the namespace.
# Sourced by scripts/services.sh.

engine_packages() { echo dockerd:docker.io; }
engine_needs() { echo netns; }

PORTS_BRIDGE=gpuports0
PORTS_BRIDGE_ADDRESS=172.31.250.1/24

engine_has_hook() {  # engine_has_hook NAME: whether the engine gets the stand-in hook
  [ "$1" != nogpu ] && [ "$1" != ports ]
}

engine_network() {  # engine_network NAME: dockerd's network options (the bridge made first)
  if [ "$1" = ports ]; then
    local in_netns=(nsenter --target "$(netns_pid)" --net --)
    if ! "${in_netns[@]}" ip link show "$PORTS_BRIDGE" >/dev/null 2>&1; then
      "${in_netns[@]}" ip link add name "$PORTS_BRIDGE" type bridge
      "${in_netns[@]}" ip addr add "$PORTS_BRIDGE_ADDRESS" dev "$PORTS_BRIDGE"
    fi
    "${in_netns[@]}" ip link set "$PORTS_BRIDGE" up
    echo "--bridge=$PORTS_BRIDGE --iptables=false --ip-masq=false --userland-proxy=true"
  else
    echo "--bridge=none --iptables=false --ip-masq=false"
  fi
}

engine_hook() {  # writes the stand-in hook into $STATE/hook
  mkdir -p "$STATE/hook"
  # Stand-in for the NVIDIA Container Toolkit's prestart hook: it reads the OCI state
  # on stdin and does nothing. Its presence makes dockerd register the nvidia driver.
  printf '#!/bin/sh\ncat >/dev/null\nexit 0\n' >"$STATE/hook/nvidia-container-runtime-hook"
  chmod +x "$STATE/hook/nvidia-container-runtime-hook"
}

engine_up() {  # engine_up NAME
  local name=$1 sock="$RUN/$1.sock" pidfile="$RUN/$1.pid" path=$PATH network
  if alive "$pidfile"; then
    return 0
  fi
  read -ra network <<<"$(engine_network "$name")"
  if engine_has_hook "$name"; then
    engine_hook
    path="$STATE/hook:$PATH"
  fi
  # After a dockerd was killed, the pid files of it and of its containerd are left, and
  # dockerd waits for (or refuses to start beside) a pid that still exists, even as a
  # zombie.
  rm -f "$pidfile"
  stop "$RUN/$name-exec/containerd/containerd.pid" "the containerd of dockerd '$name'"
  log "starting dockerd '$name' on $sock"
  mkdir -p "$STATE/$name" "$RUN/$name-exec"
  printf '{}\n' >"$STATE/daemon.json"  # not the host's /etc/docker/daemon.json
  env PATH="$path" setsid nsenter --target "$(netns_pid)" --net --mount -- dockerd \
    --config-file "$STATE/daemon.json" \
    --label "io.gpuenv.test-engine=$name" \
    --host "unix://$sock" \
    --data-root "$STATE/$name" \
    --exec-root "$RUN/$name-exec" \
    --pidfile "$pidfile" \
    "${network[@]}" \
    >"$RUN/$name.log" 2>&1 </dev/null &
  wait_for 60 "dockerd '$name' (log: $RUN/$name.log)" docker -H "unix://$sock" info
}

engine_down() {  # engine_down NAME
  stop "$RUN/$1.pid" "dockerd '$1'"
}

engine_status() {  # engine_status NAME
  alive "$RUN/$1.pid"
}
