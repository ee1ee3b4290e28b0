# shellcheck shell=bash
# Service 'podman': Podman, rootful and rootless (as gpuenv-tester, and as gpuenv-tester2:
# one engine per user, as on a server where each user runs their own), each a `podman system
# service` in the services' network namespace (containers get no network: netns = "none";
# but those of 'podman-ports', a second rootful service, and of 'podman-rootless2' get
# slirp4netns, rootless Podman's own default, so that published ports are tested on both)
# and in a mount namespace of its own where /etc is an overlay holding /etc/cdi, a bind of
# $PODMAN/cdi: Podman 4.3 reads CDI specs only from /etc/cdi and /var/run/cdi, and the
# host's stay untouched. Test-private containers.conf, storage.conf and registries.conf (the
# registry at $REGISTRY is plain http), never the system's. Sourced by scripts/services.sh.

PODMAN=$STATE/podman

# catatonit is the init (`Init: true`) Podman runs as PID 1.
podman_packages() {
  echo podman:podman newuidmap:uidmap slirp4netns:slirp4netns fuse-overlayfs:fuse-overlayfs \
    runc:runc curl:curl catatonit:catatonit
}
podman_needs() { echo netns tester; }

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
  # The 'podman-ports' service's: the same, but containers get a network of their own
  # (slirp4netns: a user-mode stack whose published ports listen in the services'
  # namespace, with no bridge and no iptables), so that published ports are tested on
  # Podman too. Nothing leaves the namespace, which has no way out.
  sed 's/^netns = "none"$/netns = "slirp4netns"/' "$PODMAN/containers.conf" \
    >"$PODMAN/containers-ports.conf"
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
  local rootless
  for rootless in podman-rootless podman-rootless2; do
    cat >"$PODMAN/storage-$rootless.conf" <<CONF
[storage]
driver = "overlay"
graphroot = "$PODMAN/$rootless-storage"
rootless_storage_path = "$PODMAN/$rootless-storage"
runroot = "$RUN/$rootless/run"
CONF
  done
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

podman_service_up() {  # podman_service_up NAME SOCKET [USER] [CONTAINERS_CONF]
  local name=$1 sock=$2 user=${3:-} conf=${4:-$PODMAN/containers.conf} pidfile="$RUN/$1.pid"
  if alive "$pidfile"; then
    return 0
  fi
  local as=() storage=$PODMAN/storage-rootful.conf runtime=/run/user/0 pidns=() in_netns
  local tmp=$PODMAN/$name-tmp
  in_netns=(nsenter --target "$(netns_pid)" --net --)
  # A TMPDIR of its own, the user's alone (as pam_tmpdir makes one): buildah keeps build
  # cache mounts in $TMPDIR/buildah-cache, which Podman 4.3 shares between all users.
  mkdir -p "$tmp"
  chown "${user:-root}:" "$tmp"
  chmod 0700 "$tmp"
  if [ -n "$user" ]; then
    # A /proc of its own: in some sandboxes a user cannot read /proc/self of the host's.
    pidns=(--pid --fork --kill-child --mount-proc)
    runtime=$RUN/$name/xdg
    mkdir -p "$RUN/$name" "$runtime" "$PODMAN/$name-storage"
    chown "$user:" "$RUN/$name" "$runtime" "$PODMAN/$name-storage"
    chmod 0700 "$runtime"
    chmod 0755 "$RUN/$name"
    storage=$PODMAN/storage-$name.conf
    as=(setpriv "--reuid=$user" "--regid=$user" --init-groups)
  fi
  rm -f "${sock#unix://}"
  log "starting podman '$name' on $sock"
  # From /: the checkout may be a private folder (mktemp -d) the user cannot enter, and
  # rootless Podman's pause process fails where it cannot chdir.
  (
    cd /
    exec setsid "${in_netns[@]}" unshare --mount --propagation private "${pidns[@]}" -- \
      sh "$PODMAN/launch.sh" "$RUN/$name-etc" "$PODMAN/cdi" \
      "${as[@]}" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "HOME=$(getent passwd "${user:-root}" | cut -d: -f6)" \
      "XDG_RUNTIME_DIR=$runtime" "TMPDIR=$tmp" "CONTAINERS_CONF=$conf" \
      "CONTAINERS_STORAGE_CONF=$storage" "CONTAINERS_REGISTRIES_CONF=$PODMAN/registries.conf" \
      podman system service --time=0 "$sock" >"$RUN/$name.log" 2>&1 </dev/null
  ) &
  echo $! >"$pidfile"
  wait_for 30 "podman '$name' (log: $RUN/$name.log)" \
    curl -sf --unix-socket "${sock#unix://}" http://podman/_ping
}

podman_subids() {
  # Rootless Podman maps the user's ids through /etc/subuid and /etc/subgid.
  local user first
  for user in gpuenv-tester:300000 gpuenv-tester2:400000; do
    first=${user#*:} user=${user%%:*}
    grep -q "^$user:" /etc/subuid 2>/dev/null ||
      usermod --add-subuids "$first-$((first + 65535))" "$user"
    grep -q "^$user:" /etc/subgid 2>/dev/null ||
      usermod --add-subgids "$first-$((first + 65535))" "$user"
  done
}

podman_up() {
  podman_subids
  podman_files
  podman_service_up podman "unix://$RUN/podman.sock"
  # Rootful as 'podman', on its storage: the same images, containers with a network.
  podman_service_up podman-ports "unix://$RUN/podman-ports.sock" "" "$PODMAN/containers-ports.conf"
  podman_service_up podman-rootless "unix://$RUN/podman-rootless/podman.sock" gpuenv-tester
  podman_service_up podman-rootless2 "unix://$RUN/podman-rootless2/podman.sock" gpuenv-tester2 \
    "$PODMAN/containers-ports.conf"
}

podman_down() {
  # A rootless service runs under `unshare --fork`, which does not pass SIGTERM on: stop
  # the podman it forked first (--kill-child ends it with unshare otherwise).
  local child name
  for name in podman-rootless podman-rootless2; do
    if alive "$RUN/$name.pid"; then
      child=$(pgrep -P "$(cat "$RUN/$name.pid")" -x podman || true)
      if [ -n "$child" ]; then
        echo "$child" >"$RUN/$name-child.pid"
        stop "$RUN/$name-child.pid" "podman '$name' (service)"
      fi
    fi
    stop "$RUN/$name.pid" "podman '$name'"
  done
  stop "$RUN/podman-ports.pid" "podman 'podman-ports'"
  stop "$RUN/podman.pid" "podman 'podman'"
}

podman_status() {
  alive "$RUN/podman.pid" && alive "$RUN/podman-ports.pid" && alive "$RUN/podman-rootless.pid" &&
    alive "$RUN/podman-rootless2.pid"
}
