# shellcheck shell=bash
# Service 'docker-tcp': the 'gpu' engine's API over TCP, on the host's loopback at
# $DOCKER_TCP (tcp://127.0.0.1:23750 in .cache/services.env), for the tests of gpuenv's
# Docker adapter over tcp://. A socat forwarder to the engine's socket, like the
# registry's. Plain TCP, no TLS and no check of who connects: every local user can use
# that engine (root on this machine, in effect), not only root and the docker group as
# through its socket. For test machines only. Sourced by scripts/services.sh.

DOCKER_TCP=127.0.0.1:23750

docker_tcp_packages() { echo socat:socat; }
docker_tcp_needs() { echo engine-gpu; }

docker_tcp_up() {
  forward docker-tcp "$DOCKER_TCP" "$RUN/gpu.sock"
  wait_for 30 "dockerd 'gpu' over TCP (log: $RUN/docker-tcp.log)" docker -H "tcp://$DOCKER_TCP" info
}

docker_tcp_down() {
  stop "$RUN/docker-tcp.pid" "the TCP forwarder of dockerd 'gpu'"
}

docker_tcp_status() {
  alive "$RUN/docker-tcp.pid"
}
