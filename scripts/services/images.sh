# shellcheck shell=bash
# Service 'images': the stand-in images, built in the 'gpu' engine and pushed to the
# registry; nothing runs, and `down` keeps them (they are slow to make: a second `up` is
# fast). Stand-ins of NGC images (Debian bookworm + Python 3 + pip, pushed as
# $REGISTRY/nvidia/pytorch:<tag>), metadata and dependency stand-ins, a CPU PyTorch
# stand-in, and gpuenv-test/busybox:1 in every engine. Each stand-in is rebuilt when its
# version below changes. Sourced by scripts/services.sh.

# Tags of the matrix that get a stand-in image in the registry.
STANDIN_TAGS=(24.06-py3 24.05-py3 24.04-py3)
STANDIN_VERSION=2  # bump when the stand-ins change: they are rebuilt
# Stand-ins for `gpuenv matrix sync`: configs carrying NGC's own metadata (never run).
SYNC_STANDIN_TAGS=(25.10-py3 26.11-py3)
SYNC_STANDIN_VERSION=1  # bump when sync_standin_env changes
# Stand-ins for building on an image that, like NGC PyTorch >= 25.03, carries NVIDIA-built
# torch/torchvision and a pip constraint file (/etc/pip/constraint.txt via PIP_CONSTRAINT).
DEPS_STANDIN_TAGS=(25.03-py3)
DEPS_STANDIN_VERSION=1  # bump when deps_standin_context changes
# A stand-in with CPU PyTorch, for multi-node torchrun jobs (a real c10d rendezvous).
TORCH_STANDIN=$REGISTRY/gpuenv-test/pytorch-cpu:2.13.0
TORCH_STANDIN_VERSION=1  # bump when torch_standin_context changes
BASE_IMAGE=gpuenv-test/bookworm-python:1
BUSYBOX_IMAGE=gpuenv-test/busybox:1
IMAGE_ENGINES=(gpu nogpu claims)

images_packages() { echo debootstrap:debootstrap busybox:busybox-static; }
images_needs() { echo engine-gpu engine-nogpu engine-claims registry; }

docker_gpu() {  # the docker CLI on the 'gpu' engine, where the stand-ins are built
  docker -H "unix://$RUN/gpu.sock" "$@"
}

has_image() {  # has_image ENGINE IMAGE
  docker -H "unix://$RUN/$1.sock" image inspect "$2" >/dev/null 2>&1
}

base_image() {  # the Debian bookworm root with Python 3 and pip, imported into 'gpu'
  if ! has_image gpu "$BASE_IMAGE"; then
    local rootfs
    rootfs=$(bookworm_rootfs)
    log "importing $BASE_IMAGE"
    tar -C "$rootfs" -c . | docker_gpu import - "$BASE_IMAGE" >/dev/null
  fi
}

busybox_image() {  # busybox_image ENGINE: a tiny image of busybox and its applets
  local engine=$1 folder applet
  if has_image "$engine" "$BUSYBOX_IMAGE"; then
    return 0
  fi
  folder=$(mktemp -d)
  mkdir -p "$folder/bin" "$folder/tmp" "$folder/etc"
  cp "$(command -v busybox)" "$folder/bin/busybox"
  for applet in sh true false sleep cat echo env id ls touch rm mkdir kill; do
    ln -s busybox "$folder/bin/$applet"
  done
  tar -C "$folder" -c . | docker -H "unix://$RUN/$engine.sock" import - "$BUSYBOX_IMAGE" >/dev/null
  rm -rf "$folder"
}

wheelhouse() {
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
}

each_standin() {  # each_standin COMMAND...: runs COMMAND... REF LABEL VERSION WHAT FILL [ARG]
  # for every stand-in, in the order they are built (FILL CONTEXT [ARG] writes its context)
  local tag
  for tag in "${STANDIN_TAGS[@]}"; do
    "$@" "$REGISTRY/nvidia/pytorch:$tag" io.gpuenv.stand-in-version "$STANDIN_VERSION" \
      "the stand-in for nvcr.io/nvidia/pytorch:$tag" pytorch_standin_context "$tag"
  done
  for tag in "${SYNC_STANDIN_TAGS[@]}"; do
    "$@" "$REGISTRY/nvidia/pytorch:$tag" io.gpuenv.sync-stand-in-version \
      "$SYNC_STANDIN_VERSION" "the metadata stand-in for nvcr.io/nvidia/pytorch:$tag" \
      sync_standin_context "$tag"
  done
  for tag in "${DEPS_STANDIN_TAGS[@]}"; do
    "$@" "$REGISTRY/nvidia/pytorch:$tag" io.gpuenv.deps-stand-in-version \
      "$DEPS_STANDIN_VERSION" "the dependency stand-in for nvcr.io/nvidia/pytorch:$tag" \
      deps_standin_context "$tag"
  done
  # Debian + Python + torch 2.13.0 (CPU), from wheels pip finds here (the engines'
  # namespace has no network: the wheels are copied in).
  "$@" "$TORCH_STANDIN" io.gpuenv.torch-stand-in-version "$TORCH_STANDIN_VERSION" \
    "the torch stand-in $TORCH_STANDIN" torch_standin_context
}

standin_version() {  # standin_version REF LABEL: the value of LABEL on REF in 'gpu' (none: empty)
  docker_gpu image inspect -f "{{index .Config.Labels \"$2\"}}" "$1" 2>/dev/null || true
}

standin_image() {  # REF LABEL VERSION WHAT FILL [ARG]...: build REF unless it carries
  # LABEL=VERSION already (FILL CONTEXT ARG... writes the build context), then push it
  local ref=$1 label=$2 wanted=$3 what=$4 fill=$5 context
  shift 5
  if [ "$(standin_version "$ref" "$label")" != "$wanted" ]; then
    log "building $what"
    context=$(mktemp -d)
    "$fill" "$context" "$@"
    docker_gpu build -q -t "$ref" "$context" >/dev/null 2>&1 ||
      die "building the stand-in $ref failed"
    rm -rf "$context"
  fi
  docker_gpu push -q "$ref" >/dev/null
}

standin_outdated() {  # REF LABEL VERSION ...: prints REF unless 'gpu' holds it with LABEL=VERSION
  [ "$(standin_version "$1" "$2")" = "$3" ] || echo "$1"
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
FROM $BASE_IMAGE
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
    *) die "no NGC metadata for the sync stand-in $1: add it to sync_standin_env" ;;
  esac
}

sync_standin_context() {  # CONTEXT TAG
  local tag=$2
  {
    echo "FROM $BUSYBOX_IMAGE"
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

deps_standin_context() {  # CONTEXT TAG
  local context=$1 tag=$2
  wheelhouse_into "$context"
  # torch as the matrix row of 25.03 records it; torchvision of the series released with
  # torch 2.7 (0.22), marked as a stand-in's build.
  fake_dist "$context/dists" torch 2.7.0a0+7c8ec84dab
  fake_dist "$context/dists" torchvision 0.22.0a0+standin
  cat >"$context/Dockerfile" <<DOCKERFILE
FROM $BASE_IMAGE
COPY wheelhouse /opt/wheelhouse
COPY dists/ /usr/local/lib/python3.11/dist-packages/
RUN python3 -m pip install -q --no-index --find-links /opt/wheelhouse --break-system-packages numpy six
RUN mkdir -p /etc/pip && python3 -m pip list --format=freeze 2>/dev/null | grep -iE '^(torch|torchvision|numpy)==' >/etc/pip/constraint.txt
ENV NVIDIA_VISIBLE_DEVICES=all PIP_CONSTRAINT=/etc/pip/constraint.txt
LABEL io.gpuenv.stand-in="nvcr.io/nvidia/pytorch:$tag" io.gpuenv.deps-stand-in-version="$DEPS_STANDIN_VERSION"
DOCKERFILE
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
FROM $BASE_IMAGE
COPY wheels /tmp/wheels
RUN python3 -m pip install -q --no-index --find-links /tmp/wheels --break-system-packages \
    torch==2.13.0 && rm -rf /tmp/wheels /root/.cache
LABEL io.gpuenv.torch-stand-in-version="$TORCH_STANDIN_VERSION"
DOCKERFILE
}

images_up() {
  local engine
  base_image
  for engine in "${IMAGE_ENGINES[@]}"; do
    busybox_image "$engine"
  done
  wheelhouse
  each_standin standin_image
}

images_down() {
  log "images: kept in the engines and the registry (slow to make)"
}

images_status() {  # the 'gpu' engine holds every stand-in, at its version, and every
  # engine the busybox image (pushes are not checked)
  local engine
  has_image gpu "$BASE_IMAGE" || return 1
  for engine in "${IMAGE_ENGINES[@]}"; do
    has_image "$engine" "$BUSYBOX_IMAGE" || return 1
  done
  [ -z "$(each_standin standin_outdated)" ]
}
