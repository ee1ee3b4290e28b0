#!/usr/bin/env bash
# The real services the integration tests talk to, private to the test run:
#   - a Docker engine on its own socket and data root, with a stand-in NVIDIA hook on
#     its PATH so `--gpus` requests reach the daemon's nvidia device driver (see
#     shared/notes/test-infrastructure.md); a second engine without the hook, as on a
#     host without the NVIDIA Container Toolkit; a third with the hook ('claims') for
#     the shared-server tests alone;
#   - an OCI registry holding stand-in NGC images (Debian bookworm + Python 3 + pip, pushed
#     as nvidia/pytorch:<tag>), on a unix socket, reached as 127.0.0.1:5000 both from the
#     engines and from the host (two socat forwarders);
#   - the first engine over tcp:// too, on 127.0.0.1:23750 (a socat forwarder to its
#     socket), for the tests of the tcp transport. Like the socket, it gives whoever can
#     reach it root on this machine: loopback only, on test machines only;
# `up` installs what is missing (apt), starts what is not running and waits until it
# answers; `down` stops what `up` started, by pid. State that is slow to make (the
# debootstrap root, images, registry storage) is kept, so a second run is fast.
#   - a Slurm controller and node (slurm-wlm, munge) with four GPUs as GRES on stand-in
#     device files, whose jobs run containers on the first engine;
#   - gpuenv-tester and gpuenv-tester2, users in the docker group, and a Python with gpuenv's dependencies
#     that they can read (the tests install the checkout's gpuenv for it).
# The engines and the registry run in network and mount namespaces of their own, with
# only a loopback interface: they cannot touch the host's interfaces (a --bridge=none
# dockerd deletes the docker0 of the namespace it runs in), its firewall, its mounts or
# its Docker engine. Clients reach the engines over their unix sockets.
# Writes .cache/services.env for the tests.
set -euo pipefail
cd "$(dirname "$0")/.."

STATE=${GPUENV_TEST_STATE:-/var/lib/gpuenv-test}
RUN=${GPUENV_TEST_RUN:-/run/gpuenv-test}
REGISTRY=127.0.0.1:5000
REGISTRY_SOCKET=$RUN/registry.sock
DOCKER_TCP=127.0.0.1:23750  # the 'gpu' engine over tcp://
NETNS_PID=$RUN/netns.pid
ENV_FILE=.cache/services.env
IN_MN1=(nsenter --net=/run/netns/gpuenv-mn1)
# Tags of the matrix that get a stand-in image in the registry.
STANDIN_TAGS=(24.06-py3 24.05-py3 24.04-py3)
STANDIN_VERSION=2  # bump when the stand-ins change: they are rebuilt
# Stand-ins for `gpuenv matrix sync`: configs carrying NGC's own metadata (never run).
SYNC_STANDIN_TAGS=(25.10-py3 26.11-py3)
SYNC_STANDIN_VERSION=1  # bump when sync_standin_env changes
# Stand-ins for building on an image that, like NGC PyTorch >= 25.03, carries NVIDIA-built
# torch/torchvision and a pip constraint file (/etc/pip/constraint.txt via PIP_CONSTRAINT).
DEPS_STANDIN_TAGS=(25.03-py3)
DEPS_STANDIN_VERSION=1  # bump when deps_standin_images changes
# A stand-in with CPU PyTorch, for multi-node torchrun jobs (a real c10d rendezvous).
TORCH_STANDIN=$REGISTRY/gpuenv-test/pytorch-cpu:2.13.0
TORCH_STANDIN_VERSION=1  # bump when torch_standin_image changes

# shellcheck source=scripts/lib.sh
. scripts/lib.sh

# The services' namespaces live as long as a sleeping process that holds them (its pid
# in $NETNS_PID); everything else enters them with nsenter.
netns_ready() {
  local pid
  pid=$(cat "$NETNS_PID" 2>/dev/null) || return 1
  [ "$(readlink "/proc/$pid/ns/net")" != "$(readlink /proc/self/ns/net)" ] &&
    [ "$(readlink "/proc/$pid/ns/mnt")" != "$(readlink /proc/self/ns/mnt)" ] &&
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = sleep ]
}

netns_up() {
  if ! alive "$NETNS_PID" || ! netns_ready; then
    # What still runs was started in namespaces that are gone: the registry there
    # cannot be reached from new ones.
    engines_down
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
  fi
  IN_NETNS=(nsenter --target "$(cat "$NETNS_PID")" --net --mount --)
}

dockerd_up() {  # dockerd_up NAME WITH_HOOK
  local name=$1 hook=$2 sock="$RUN/$1.sock" pidfile="$RUN/$1.pid"
  if alive "$pidfile"; then
    return 0
  fi
  local path=$PATH
  if [ "$hook" = yes ]; then
    mkdir -p "$STATE/hook"
    # Stand-in for the NVIDIA Container Toolkit's prestart hook: it reads the OCI state
    # on stdin and does nothing. Its presence makes dockerd register the nvidia driver.
    printf '#!/bin/sh\ncat >/dev/null\nexit 0\n' >"$STATE/hook/nvidia-container-runtime-hook"
    chmod +x "$STATE/hook/nvidia-container-runtime-hook"
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
  env PATH="$path" setsid "${IN_NETNS[@]}" dockerd \
    --config-file "$STATE/daemon.json" \
    --label "io.gpuenv.test-engine=$name" \
    --host "unix://$sock" \
    --data-root "$STATE/$name" \
    --exec-root "$RUN/$name-exec" \
    --pidfile "$pidfile" \
    --bridge=none --iptables=false --ip-masq=false \
    >"$RUN/$name.log" 2>&1 </dev/null &
  wait_for 60 "dockerd '$name' (log: $RUN/$name.log)" docker -H "unix://$sock" info
}

standin_images() {
  local docker=(docker -H "unix://$RUN/gpu.sock")
  if ! "${docker[@]}" image inspect gpuenv-test/bookworm-python:1 >/dev/null 2>&1; then
    local rootfs
    rootfs=$(bookworm_rootfs)
    log "importing gpuenv-test/bookworm-python:1"
    tar -C "$rootfs" -c . | "${docker[@]}" import - gpuenv-test/bookworm-python:1 >/dev/null
  fi
  local sock
  for sock in "$RUN/gpu.sock" "$RUN/nogpu.sock" "$RUN/claims.sock"; do
    if ! docker -H "unix://$sock" image inspect gpuenv-test/busybox:1 >/dev/null 2>&1; then
      local bb
      bb=$(mktemp -d)
      mkdir -p "$bb/bin" "$bb/tmp" "$bb/etc"
      cp "$(command -v busybox)" "$bb/bin/busybox"
      for applet in sh true false sleep cat echo env id ls touch rm mkdir kill; do
        ln -s busybox "$bb/bin/$applet"
      done
      tar -C "$bb" -c . | docker -H "unix://$sock" import - gpuenv-test/busybox:1 >/dev/null
      rm -rf "$bb"
    fi
  done
  # A wheelhouse inside the stand-ins (/opt/wheelhouse): containers here have no network,
  # so tests and the benchmark install real packages from it with pip --no-index.
  local wheels="$STATE/wheelhouse"
  if [ ! -f "$wheels/.complete" ]; then
    log "downloading wheels for the stand-in images' wheelhouse (numpy, six)"
    mkdir -p "$wheels"
    python3 -m pip download -q --only-binary=:all: --python-version 3.11 \
      --platform manylinux2014_x86_64 -d "$wheels" numpy six >/dev/null 2>&1 ||
      die "pip download of the wheelhouse failed"
    touch "$wheels/.complete"
  fi
  for tag in "${STANDIN_TAGS[@]}"; do
    standin_image "$REGISTRY/nvidia/pytorch:$tag" io.gpuenv.stand-in-version "$STANDIN_VERSION" \
      "the stand-in for nvcr.io/nvidia/pytorch:$tag" pytorch_standin_context "$tag"
  done
}

standin_image() {  # REF LABEL VERSION WHAT FILL [ARG]...: build REF unless it carries
  # LABEL=VERSION already (FILL CONTEXT ARG... writes the build context), then push it
  local ref=$1 label=$2 wanted=$3 what=$4 fill=$5 version context
  shift 5
  local docker=(docker -H "unix://$RUN/gpu.sock")
  version=$("${docker[@]}" image inspect -f "{{index .Config.Labels \"$label\"}}" \
    "$ref" 2>/dev/null || true)
  if [ "$version" != "$wanted" ]; then
    log "building $what"
    context=$(mktemp -d)
    "$fill" "$context" "$@"
    "${docker[@]}" build -q -t "$ref" "$context" >/dev/null 2>&1 ||
      die "building the stand-in $ref failed"
    rm -rf "$context"
  fi
  "${docker[@]}" push -q "$ref" >/dev/null
}

wheelhouse_into() {  # CONTEXT: the stand-ins' wheelhouse, copied into a build context
  cp -r "$STATE/wheelhouse" "$1/wheelhouse"
  rm -f "$1/wheelhouse/.complete"
}

pytorch_standin_context() {  # CONTEXT TAG
  local context=$1 tag=$2
  wheelhouse_into "$context"
  # Like NGC images: python on PATH, NVIDIA_VISIBLE_DEVICES=all baked in.
  cat >"$context/Dockerfile" <<DOCKERFILE
FROM gpuenv-test/bookworm-python:1
COPY wheelhouse /opt/wheelhouse
ENV NVIDIA_VISIBLE_DEVICES=all
LABEL io.gpuenv.stand-in="nvcr.io/nvidia/pytorch:$tag" io.gpuenv.stand-in-version="$STANDIN_VERSION"
DOCKERFILE
}

# The environment and labels of an NGC image's config, as `docker inspect` shows them.
sync_standin_env() {  # sync_standin_env TAG: Dockerfile lines
  case "$1" in
    25.10-py3)
      # nvcr.io/nvidia/pytorch:25.10-py3 as published: its image history (the arm64
      # variant, reconstructed into a Dockerfile in a public repository) sets CUDA_VERSION
      # 13.0.2.006, CUDA_DRIVER_VERSION 580.95.05, NVIDIA_REQUIRE_CUDA cuda>=9.0,
      # NCCL_VERSION 2.27.7, CUDNN_VERSION 9.14.0.64, PYTORCH_BUILD_VERSION 2.9.0a0+145a3a7,
      # NVIDIA_PYTORCH_VERSION 25.10 and keeps Ubuntu's labels (24.04). CUDA_ARCH_LIST
      # is the amd64 one of a CUDA 13.0.2.006 NGC environment dump (the arm64 build lists
      # 8.0 8.6 9.0 10.0 11.0 12.0); Triton 25.10 notes: compute capability 7.5 and later.
      cat <<'ENVS'
ENV CUDA_VERSION=13.0.2.006 CUDA_DRIVER_VERSION=580.95.05 NVIDIA_REQUIRE_CUDA="cuda>=9.0"
ENV NCCL_VERSION=2.27.7 CUDNN_VERSION=9.14.0.64 CUDA_ARCH_LIST="7.5 8.0 8.6 9.0 10.0 12.0"
ENV NVIDIA_PRODUCT_NAME=PyTorch PYTORCH_BUILD_VERSION=2.9.0a0+145a3a7 PYTORCH_VERSION=2.9.0a0+145a3a7 PYTORCH_BUILD_NUMBER=0 NVIDIA_PYTORCH_VERSION=25.10
LABEL org.opencontainers.image.ref.name=ubuntu org.opencontainers.image.version=24.04 com.nvidia.pytorch.version=2.9.0a0+145a3a7
ENVS
      ;;
    26.11-py3)
      # A release newer than the shipped matrix. No public metadata of a 26.11 image
      # exists yet: the variables are NGC's (as above); CUDA 13.4.3.001 and compute
      # capability 7.5+ are those of 26.10 (Triton rel-26-10 notes); the PyTorch
      # version is marked as a stand-in's. No cuDNN/NCCL/driver values are invented.
      cat <<'ENVS'
ENV CUDA_VERSION=13.4.3.001 NVIDIA_REQUIRE_CUDA="cuda>=9.0" CUDA_ARCH_LIST="7.5 8.0 8.6 9.0 10.0 11.0 12.0"
ENV NVIDIA_PRODUCT_NAME=PyTorch PYTORCH_BUILD_VERSION=2.15.0a0+standin PYTORCH_VERSION=2.15.0a0+standin PYTORCH_BUILD_NUMBER=0 NVIDIA_PYTORCH_VERSION=26.11
LABEL org.opencontainers.image.ref.name=ubuntu org.opencontainers.image.version=24.04
ENVS
      ;;
  esac
}

sync_standin_images() {
  local tag
  for tag in "${SYNC_STANDIN_TAGS[@]}"; do
    standin_image "$REGISTRY/nvidia/pytorch:$tag" io.gpuenv.sync-stand-in-version \
      "$SYNC_STANDIN_VERSION" "the metadata stand-in for nvcr.io/nvidia/pytorch:$tag" \
      sync_standin_context "$tag"
  done
}

sync_standin_context() {  # CONTEXT TAG
  local tag=$2
  {
    echo "FROM gpuenv-test/busybox:1"
    sync_standin_env "$tag"
    echo "LABEL io.gpuenv.stand-in=\"nvcr.io/nvidia/pytorch:$tag\" io.gpuenv.sync-stand-in-version=\"$SYNC_STANDIN_VERSION\""
  } >"$1/Dockerfile"
}

# A fake distribution as an NVIDIA build installs it: only its metadata (no code).
fake_dist() {  # fake_dist FOLDER NAME VERSION
  local info="$1/$2-$3.dist-info"
  mkdir -p "$info"
  printf 'Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: gpuenv test stand-in of an NVIDIA build\n' \
    "$2" "$3" >"$info/METADATA"
  printf 'stand-in\n' >"$info/INSTALLER"
  : >"$info/RECORD"
}

deps_standin_images() {
  local tag
  for tag in "${DEPS_STANDIN_TAGS[@]}"; do
    standin_image "$REGISTRY/nvidia/pytorch:$tag" io.gpuenv.deps-stand-in-version \
      "$DEPS_STANDIN_VERSION" "the dependency stand-in for nvcr.io/nvidia/pytorch:$tag" \
      deps_standin_context "$tag"
  done
}

deps_standin_context() {  # CONTEXT TAG
  local context=$1 tag=$2
  wheelhouse_into "$context"
  # torch as the matrix row of 25.03 records it; torchvision of the series released with
  # torch 2.7 (0.22), marked as a stand-in's build.
  fake_dist "$context/dists" torch 2.7.0a0+7c8ec84dab
  fake_dist "$context/dists" torchvision 0.22.0a0+standin
  cat >"$context/Dockerfile" <<DOCKERFILE
FROM gpuenv-test/bookworm-python:1
COPY wheelhouse /opt/wheelhouse
COPY dists/ /usr/local/lib/python3.11/dist-packages/
RUN python3 -m pip install -q --no-index --find-links /opt/wheelhouse --break-system-packages numpy six
RUN mkdir -p /etc/pip && python3 -m pip list --format=freeze 2>/dev/null | grep -iE '^(torch|torchvision|numpy)==' >/etc/pip/constraint.txt
ENV NVIDIA_VISIBLE_DEVICES=all PIP_CONSTRAINT=/etc/pip/constraint.txt
LABEL io.gpuenv.stand-in="nvcr.io/nvidia/pytorch:$tag" io.gpuenv.deps-stand-in-version="$DEPS_STANDIN_VERSION"
DOCKERFILE
}

torch_standin_image() {  # Debian + Python + torch 2.13.0 (CPU), from wheels pip finds
  # here (the engines' namespace has no network: the wheels are copied in)
  standin_image "$TORCH_STANDIN" io.gpuenv.torch-stand-in-version "$TORCH_STANDIN_VERSION" \
    "the torch stand-in $TORCH_STANDIN" torch_standin_context
}

torch_standin_context() {  # CONTEXT
  local context=$1 wheels="$STATE/torch-wheels"
  if [ ! -f "$wheels/.complete" ]; then
    log "downloading torch 2.13.0 (CPU) and its dependencies for the torch stand-in"
    mkdir -p "$wheels"
    python3 -m pip download -q --only-binary=:all: --python-version 3.11 \
      --platform manylinux_2_28_x86_64 -d "$wheels" torch==2.13.0 >/dev/null 2>&1 ||
      die "pip download of torch 2.13.0 failed"
    touch "$wheels/.complete"
  fi
  cp -r "$wheels" "$context/wheels"
  rm -f "$context/wheels/.complete"
  cat >"$context/Dockerfile" <<DOCKERFILE
FROM gpuenv-test/bookworm-python:1
COPY wheels /tmp/wheels
RUN python3 -m pip install -q --no-index --find-links /tmp/wheels --break-system-packages \
    torch==2.13.0 && rm -rf /tmp/wheels /root/.cache
LABEL io.gpuenv.torch-stand-in-version="$TORCH_STANDIN_VERSION"
DOCKERFILE
}

forward_up() {  # forward_up NAME ADDRESS SOCKET [LAUNCHER...]: TCP ADDRESS (IP:PORT) on
  # the loopback of the namespace LAUNCHER runs in (this one when none), to the unix SOCKET
  local name=$1 address=$2 socket=$3 pidfile="$RUN/$1.pid"
  shift 3
  if alive "$pidfile"; then
    return 0
  fi
  setsid "$@" socat "TCP-LISTEN:${address##*:},bind=${address%:*},reuseaddr,fork" \
    "UNIX-CONNECT:$socket" >"$RUN/$name.log" 2>&1 </dev/null &
  echo $! >"$pidfile"
}

docker_tcp_up() {  # the 'gpu' engine as tcp://$DOCKER_TCP, from this namespace
  forward_up docker-tcp "$DOCKER_TCP" "$RUN/gpu.sock"
  wait_for 30 "the 'gpu' engine over tcp://$DOCKER_TCP (log: $RUN/docker-tcp.log)" \
    docker -H "tcp://$DOCKER_TCP" info
}

registry_answers() {
  "$@" python3 -c "import urllib.request; urllib.request.urlopen('http://$REGISTRY/v2/', timeout=1)"
}

registry_reachable() {  # as 127.0.0.1:5000 from the engines' namespace and from this one
  registry_up "${IN_NETNS[@]}"
  forward_up registry-engines "$REGISTRY" "$REGISTRY_SOCKET" "${IN_NETNS[@]}"
  forward_up registry-host "$REGISTRY" "$REGISTRY_SOCKET"
  wait_for 30 "the registry, from the engines (log: $RUN/registry-engines.log)" \
    registry_answers "${IN_NETNS[@]}"
  wait_for 30 "the registry, from the host (log: $RUN/registry-host.log)" registry_answers
}

tester_up() {  # a user who is not root, and a Python with gpuenv's dependencies it can read
  # A non-root user in the docker group: jobs and runs "as the submitting user" need one.
  id gpuenv-tester >/dev/null 2>&1 ||
    useradd --system --create-home --shell /bin/bash --groups docker gpuenv-tester
  # A second one: shared-server tests play one user against another (claims, locks).
  id gpuenv-tester2 >/dev/null 2>&1 ||
    useradd --system --create-home --shell /bin/bash --groups docker gpuenv-tester2
  # The distribution's interpreter: another user may not be able to read the one .venv
  # was made from (pyenv's under /root), let alone a checkout in a private folder.
  local python=/usr/bin/python3 want
  if ! "$python" -c 'import sys, ensurepip; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    log "installing python3 and python3-venv (apt) for the test user"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv >/dev/null
    "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
      die "$python is older than Python 3.11, which gpuenv needs"
  fi
  want=$(sha256sum pyproject.toml | cut -d' ' -f1)
  # One venv per set of dependencies: checkouts with different pyproject.toml files (two
  # branches tested at once) never rebuild each other's.
  TESTER_VENV="$STATE/tester-venv-${want:0:12}"
  local venv=$TESTER_VENV
  if [ "$(cat "$venv/.gpuenv-deps" 2>/dev/null)" != "$want" ]; then
    log "making $venv: gpuenv's dependencies for the test user (pip)"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    # The build backend too, so that the tests can build gpuenv's wheel offline.
    "$python" -c 'import tomllib
meta = tomllib.load(open("pyproject.toml", "rb"))
print("\n".join(meta["build-system"]["requires"] + meta["project"]["dependencies"]))' \
      >"$venv/requirements.txt"
    "$venv/bin/python" -m pip install -q -r "$venv/requirements.txt" ||
      die "installing gpuenv's dependencies into $venv failed"
    chmod -R a+rX "$venv"
    echo "$want" >"$venv/.gpuenv-deps"
  fi
  chmod a+rx "$STATE"
}

# Podman, rootful and rootless (as gpuenv-tester), each a `podman system service` in the
# services' network namespace (containers get no network: netns = "none") and in a mount
# namespace of its own where /etc is an overlay holding /etc/cdi, a bind of $PODMAN/cdi:
# Podman 4.3 reads CDI specs only from /etc/cdi and /var/run/cdi, and the host's stay
# untouched. Test-private containers.conf, storage.conf and registries.conf (the
# registry at $REGISTRY is plain http), never the system's.
PODMAN=$STATE/podman
podman_files() {
  mkdir -p "$PODMAN/cdi" "$PODMAN/rootful" "$PODMAN/dev"
  chmod 0755 "$PODMAN" "$PODMAN/cdi" "$PODMAN/dev"
  # Stand-in GPU device nodes for the tests' CDI specs: /dev/null's and /dev/zero's numbers,
  # in the test folder (rootless Podman 4.3 binds a node's own path: it must exist).
  [ -e "$PODMAN/dev/nvidia0" ] || mknod -m 0666 "$PODMAN/dev/nvidia0" c 1 3
  [ -e "$PODMAN/dev/nvidia1" ] || mknod -m 0666 "$PODMAN/dev/nvidia1" c 1 5
  # The runtime cannot raise limits above the service's own (no CAP_SYS_RESOURCE in
  # some sandboxes): containers get the limits the service itself has; crun 1.8 refuses
  # hybrid cgroups, runc does not.
  cat >"$PODMAN/containers.conf" <<CONF
[containers]
netns = "none"
default_ulimits = ["nofile=$(ulimit -Hn):$(ulimit -Hn)"]
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
runtime = "runc"
CONF
  cat >"$PODMAN/registries.conf" <<CONF
unqualified-search-registries = []
[[registry]]
location = "$REGISTRY"
insecure = true
CONF
  cat >"$PODMAN/storage-rootful.conf" <<CONF
[storage]
driver = "overlay"
graphroot = "$PODMAN/rootful"
runroot = "$RUN/podman-rootful"
CONF
  cat >"$PODMAN/storage-rootless.conf" <<CONF
[storage]
driver = "overlay"
graphroot = "$PODMAN/rootless"
rootless_storage_path = "$PODMAN/rootless"
runroot = "$RUN/podman-rootless/run"
CONF
  cat >"$PODMAN/launch.sh" <<'LAUNCH'
# launch.sh UPPER CDI CMD...: /etc as an overlay (upper on a tmpfs at UPPER) with /etc/cdi
# bound to CDI, in this (private) mount namespace; then CMD.
set -e
upper=$1 cdi=$2
shift 2
mkdir -p "$upper"
mount -t tmpfs gpuenv-podman-etc "$upper"
mkdir -p "$upper/u" "$upper/w"
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$upper/u,workdir=$upper/w" /etc
mkdir -p /etc/cdi
mount --bind "$cdi" /etc/cdi
exec "$@"
LAUNCH
  chmod 0644 "$PODMAN"/*.conf "$PODMAN/launch.sh"
}

podman_service_up() {  # podman_service_up NAME SOCKET [USER]
  local name=$1 sock=$2 user=${3:-} pidfile="$RUN/$1.pid"
  if alive "$pidfile"; then
    return 0
  fi
  local as=() storage=$PODMAN/storage-rootful.conf runtime=/run/user/0 pidns=()
  if [ -n "$user" ]; then
    # A /proc of its own: in some sandboxes a user cannot read /proc/self of the host's.
    pidns=(--pid --fork --kill-child --mount-proc)
    runtime=$RUN/$name/xdg
    mkdir -p "$RUN/$name" "$runtime" "$PODMAN/rootless"
    chown "$user:" "$RUN/$name" "$runtime" "$PODMAN/rootless"
    chmod 0700 "$runtime"
    chmod 0755 "$RUN/$name"
    storage=$PODMAN/storage-rootless.conf
    as=(setpriv "--reuid=$user" "--regid=$user" --init-groups)
  fi
  rm -f "${sock#unix://}"
  log "starting podman '$name' on $sock"
  # From /: the checkout may be a private folder (mktemp -d) the user cannot enter, and
  # rootless Podman's pause process fails where it cannot chdir.
  (
    cd /
    exec setsid "${IN_NETNS_NET[@]}" unshare --mount --propagation private "${pidns[@]}" -- \
      sh "$PODMAN/launch.sh" "$RUN/$name-etc" "$PODMAN/cdi" \
      "${as[@]}" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "HOME=$(getent passwd "${user:-root}" | cut -d: -f6)" \
      "XDG_RUNTIME_DIR=$runtime" "CONTAINERS_CONF=$PODMAN/containers.conf" \
      "CONTAINERS_STORAGE_CONF=$storage" "CONTAINERS_REGISTRIES_CONF=$PODMAN/registries.conf" \
      podman system service --time=0 "$sock" >"$RUN/$name.log" 2>&1 </dev/null
  ) &
  echo $! >"$pidfile"
  wait_for 30 "podman '$name' (log: $RUN/$name.log)" \
    curl -sf --unix-socket "${sock#unix://}" http://podman/_ping
}

podman_up() {
  # catatonit is the init (`Init: true`) Podman runs as PID 1.
  install_missing podman:podman newuidmap:uidmap slirp4netns:slirp4netns \
    fuse-overlayfs:fuse-overlayfs runc:runc curl:curl catatonit:catatonit
  # Rootless Podman maps the user's ids through /etc/subuid and /etc/subgid.
  grep -q '^gpuenv-tester:' /etc/subuid 2>/dev/null ||
    usermod --add-subuids 300000-365535 gpuenv-tester
  grep -q '^gpuenv-tester:' /etc/subgid 2>/dev/null ||
    usermod --add-subgids 300000-365535 gpuenv-tester
  IN_NETNS_NET=(nsenter --target "$(cat "$NETNS_PID")" --net --)
  podman_files
  podman_service_up podman "unix://$RUN/podman.sock"
  podman_service_up podman-rootless "unix://$RUN/podman-rootless/podman.sock" gpuenv-tester
}

up() {
  need_root
  install_missing dockerd:docker.io docker-registry:docker-registry debootstrap:debootstrap \
    busybox:busybox-static docker-compose:docker-compose socat:socat ip:iproute2 \
    nsenter:util-linux prometheus:prometheus promtool:prometheus gcc:gcc
  mkdir -p "$STATE" "$RUN" .cache
  netns_up
  dockerd_up gpu yes
  dockerd_up nogpu no
  # The shared-server tests' own engine (with the stand-in hook): their runs live for
  # seconds, and a test session that starts elsewhere clears gpuenv's containers from
  # the engines it uses (conftest clear_leftovers).
  dockerd_up claims yes
  docker_tcp_up
  registry_reachable
  standin_images
  sync_standin_images
  deps_standin_images
  torch_standin_image
  slurm_up
  slurm_multi_up
  # The gpuenv-multi nodes pull from the registry as 127.0.0.1:5000 too (Apptainer on the
  # batch host, enroot on every node).
  local node
  for node in mn1 mn2; do
    forward_up "registry-$node" "$REGISTRY" "$REGISTRY_SOCKET" nsenter --net="/run/netns/gpuenv-$node"
    wait_for 30 "the registry, from gpuenv-$node (log: $RUN/registry-$node.log)" \
      registry_answers nsenter --net="/run/netns/gpuenv-$node"
  done
  # Jobs left by an earlier test run that was interrupted hold GPUs for nothing; those of
  # test sessions still running (other checkouts share these clusters) are left alone.
  cancel_orphaned_test_jobs
  cancel_orphaned_test_jobs env SLURM_CONF="$MULTI_CONF" "${IN_MN1[@]}"
  tester_up
  podman_up
  cat >"$ENV_FILE" <<ENV
DOCKER_HOST=unix://$RUN/gpu.sock
GPUENV_TEST_DOCKER_NOGPU=unix://$RUN/nogpu.sock
GPUENV_TEST_DOCKER_CLAIMS=unix://$RUN/claims.sock
GPUENV_TEST_DOCKER_TCP=tcp://$DOCKER_TCP
GPUENV_TEST_REGISTRY=$REGISTRY
GPUENV_TEST_NETNS=/proc/$(cat "$NETNS_PID")/ns/net
GPUENV_TEST_STATE=$STATE
GPUENV_TEST_STANDIN_TAGS="${STANDIN_TAGS[*]}"
GPUENV_TEST_SYNC_STANDIN_TAGS="${SYNC_STANDIN_TAGS[*]}"
GPUENV_TEST_DEPS_STANDIN_TAGS="${DEPS_STANDIN_TAGS[*]}"
GPUENV_TEST_TORCH_IMAGE=$TORCH_STANDIN
GPUENV_TEST_MULTI_SLURM_CONF=$MULTI_CONF
GPUENV_TEST_MULTI_NETNS=/run/netns/gpuenv-mn1
GPUENV_TEST_USER=gpuenv-tester
GPUENV_TEST_USER2=gpuenv-tester2
GPUENV_TEST_USER_PYTHON=$TESTER_VENV/bin/python
GPUENV_TEST_PODMAN=unix://$RUN/podman.sock
GPUENV_TEST_PODMAN_ROOTLESS=unix://$RUN/podman-rootless/podman.sock
GPUENV_TEST_CDI_DIR=$PODMAN/cdi
ENV
  log "services ready ($ENV_FILE)"
}

podman_down() {
  # The rootless service runs under `unshare --fork`, which does not pass SIGTERM on:
  # stop the podman it forked first (--kill-child ends it with unshare otherwise).
  local child
  if alive "$RUN/podman-rootless.pid"; then
    child=$(pgrep -P "$(cat "$RUN/podman-rootless.pid")" -x podman || true)
    if [ -n "$child" ]; then
      echo "$child" >"$RUN/podman-rootless-child.pid"
      stop "$RUN/podman-rootless-child.pid" "podman 'podman-rootless' (service)"
    fi
  fi
  stop "$RUN/podman-rootless.pid" "podman 'podman-rootless'"
  stop "$RUN/podman.pid" "podman 'podman'"
}

engines_down() {
  podman_down
  stop "$RUN/docker-tcp.pid" "the 'gpu' engine's tcp forwarder"
  stop "$RUN/registry-host.pid" "the registry's forwarder on the host"
  stop "$RUN/registry-engines.pid" "the registry's forwarder for the engines"
  stop "$RUN/registry.pid" registry
  stop "$RUN/gpu.pid" "dockerd 'gpu'"
  stop "$RUN/nogpu.pid" "dockerd 'nogpu'"
  stop "$RUN/claims.pid" "dockerd 'claims'"
}

down() {
  stop "$RUN/registry-mn1.pid" "the registry's forwarder for gpuenv-mn1"
  stop "$RUN/registry-mn2.pid" "the registry's forwarder for gpuenv-mn2"
  slurm_multi_down
  slurm_down
  engines_down
  stop "$NETNS_PID" "the services' namespaces"
  rm -f "$ENV_FILE"
}

status() {  # exit 0 when every service is running
  local pidfile
  for pidfile in netns gpu nogpu claims docker-tcp registry registry-engines registry-host \
    slurmctld slurmd \
    podman podman-rootless slurmctld-multi slurmd-mn1 slurmd-mn2 registry-mn1 registry-mn2; do
    alive "$RUN/$pidfile.pid" || return 1
  done
  netns_ready
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) die "usage: scripts/services.sh up|down|status" ;;
esac
