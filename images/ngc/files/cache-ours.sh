# shellcheck shell=sh
# Sourced by the install scripts. `cache_ours DIR...` says whether a cache mount (DIR, and
# the folders below it that the step uses) may be used: this build's user owns each, no
# one else can write it, and it can be written. Otherwise it prints one warning and fails,
# and the step installs without the cache. Ours alone: Podman 4.3 keeps every user's cache
# mounts in one host folder, where another user can make a folder first, and what another
# user wrote must never reach an install. Writable: a rootless engine may mount a folder
# its user cannot write.
cache_ours() {
  for path in "$@"; do
    if ! mkdir -p "$path" 2>/dev/null; then
      cache_refused "$1" "it cannot be written here"
      return 1
    fi
    owner=$(stat -c %u "$path")
    mode=$(stat -c %a "$path")
    if [ "$owner" != "$(id -u)" ] || [ $((0$mode & 022)) -ne 0 ]; then
      cache_refused "$1" "$path belongs to uid $owner here, mode $mode: another user's"
      return 1
    fi
    if ! (: >"$path/.gpuenv-probe-$$") 2>/dev/null; then
      cache_refused "$1" "it cannot be written here"
      return 1
    fi
    rm -f "$path/.gpuenv-probe-$$"
  done
}

cache_refused() {
  echo "gpuenv: warning: not using the dependency cache ($1): $2; this build downloads" \
    "every requirement"
}
