# shellcheck shell=bash
# Service 'registry': an OCI registry (Distribution's, Debian's docker-registry) in the
# services' namespaces, on a unix socket, reached as $REGISTRY (127.0.0.1:5000) both from
# the engines and from the host through two socat forwarders: 'registry-engines' on the
# namespaces' loopback, 'registry-host' on the host's. Its storage ($STATE/registry) is
# kept. The Slurm cluster gpuenv-multi forwards it into its own namespaces
# (slurm-multi.sh). Sourced by scripts/services.sh.

REGISTRY_SOCKET=$RUN/registry.sock

registry_packages() { echo docker-registry:docker-registry socat:socat; }
registry_needs() { echo netns; }

registry_answers() {  # registry_answers [LAUNCHER...]: the registry answers at $REGISTRY,
  # from the namespace LAUNCHER runs in (this one when none)
  "$@" python3 -c "import urllib.request; urllib.request.urlopen('http://$REGISTRY/v2/', timeout=1)"
}

registry_up() {  # reachable as $REGISTRY from the engines' namespace and from this one
  local -a in_netns
  in_netns=(nsenter --target "$(netns_pid)" --net --mount --)
  registry_serve unix "$REGISTRY_SOCKET" "${in_netns[@]}"
  forward registry-engines "$REGISTRY" "$REGISTRY_SOCKET" "${in_netns[@]}"
  forward registry-host "$REGISTRY" "$REGISTRY_SOCKET"
  wait_for 30 "the registry, from the engines (log: $RUN/registry-engines.log)" \
    registry_answers "${in_netns[@]}"
  wait_for 30 "the registry, from the host (log: $RUN/registry-host.log)" registry_answers
}

registry_down() {
  stop "$RUN/registry-host.pid" "the registry's forwarder on the host"
  stop "$RUN/registry-engines.pid" "the registry's forwarder for the engines"
  stop "$RUN/registry.pid" registry
}

registry_status() {
  alive "$RUN/registry.pid" && alive "$RUN/registry-engines.pid" && alive "$RUN/registry-host.pid"
}
