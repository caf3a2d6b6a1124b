#!/usr/bin/env bash
# build_images.sh: the shardopt container images, FROM scratch.
#
# Builds three images with the classic builder (no BuildKit, no registry):
#   shardopt-runtime:TAG  the dynamic loader and every shared library `ldd`
#                         lists for the binaries below, nothing else
#   shardopt-server:TAG   + shardopt_server and shardoptctl (its health check)
#   shardopt-trainer:TAG  + mlp_trainer (the main job's trainer) and
#                         test_trainer (the integration tests' trainer)
#   shardopt-prometheus:TAG  + Debian's prometheus and its web UI (for
#                         deploy/docker-compose.monitoring.yml), when the
#                         prometheus package is installed (else skipped,
#                         said on stderr)
# and prints their sizes. The server and trainer images are layers on the
# runtime image, so the libraries are stored once.
#
# It never runs bazel: it takes the binaries from bazel-bin (build them with
#   bazel build //server:shardopt_server //tools/ctl:shardoptctl \
#     //tools/train:mlp_trainer //tests:test_trainer
# ) or from the paths given, so a Bazel test can pass its runfiles.
#
# Usage: build_images.sh [options]
#   --server_bin=PATH        shardopt_server  (env SHARDOPT_SERVER_BIN)
#   --ctl_bin=PATH           shardoptctl      (env SHARDOPTCTL_BIN)
#   --mlp_trainer_bin=PATH   mlp_trainer      (env MLP_TRAINER_BIN)
#   --test_trainer_bin=PATH  test_trainer     (env TEST_TRAINER_BIN)
#   --prometheus_bin=PATH    prometheus       (env PROMETHEUS_BIN, default
#                            /usr/bin/prometheus; its UI from
#                            /usr/share/prometheus/web)
#   --tag=TAG                image tag (env SHARDOPT_IMAGE_TAG, default latest)
#   --docker=PATH            docker CLI (env DOCKER, default docker)
# Exit status: 0 when the images were built; 2 for a missing binary or
# a library ldd cannot find; 1 when docker build fails.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
bin_dir=$repo/bazel-bin
server_bin=${SHARDOPT_SERVER_BIN:-$bin_dir/server/shardopt_server}
ctl_bin=${SHARDOPTCTL_BIN:-$bin_dir/tools/ctl/shardoptctl}
mlp_trainer_bin=${MLP_TRAINER_BIN:-$bin_dir/tools/train/mlp_trainer}
test_trainer_bin=${TEST_TRAINER_BIN:-$bin_dir/tests/test_trainer}
prometheus_bin=${PROMETHEUS_BIN:-/usr/bin/prometheus}
prometheus_web=/usr/share/prometheus/web
tag=${SHARDOPT_IMAGE_TAG:-latest}
docker=${DOCKER:-docker}

die() {
  echo "build_images: $*" >&2
  exit 2
}

for arg in "$@"; do
  case $arg in
    --server_bin=*) server_bin=${arg#*=} ;;
    --ctl_bin=*) ctl_bin=${arg#*=} ;;
    --mlp_trainer_bin=*) mlp_trainer_bin=${arg#*=} ;;
    --test_trainer_bin=*) test_trainer_bin=${arg#*=} ;;
    --prometheus_bin=*) prometheus_bin=${arg#*=} ;;
    --tag=*) tag=${arg#*=} ;;
    --docker=*) docker=${arg#*=} ;;
    --help | -h) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$arg' (--help)" ;;
  esac
done

binaries=("$server_bin" "$ctl_bin" "$mlp_trainer_bin" "$test_trainer_bin")
for bin in "${binaries[@]}"; do
  [ -x "$bin" ] || die "no executable $bin; build it first: bazel build //server:shardopt_server //tools/ctl:shardoptctl //tools/train:mlp_trainer //tests:test_trainer"
done

context=$(mktemp -d "${TMPDIR:-/tmp}/shardopt-images.XXXXXX")
trap 'rm -rf "$context"' EXIT
mkdir -p "$context/runtime/tmp" "$context/server" "$context/trainer" "$context/prometheus"
chmod 1777 "$context/runtime/tmp"  # Scratch has no /tmp; libraries may want one.

# Every library at the path ldd resolved it to (the loader of a scratch image
# has no ld.so.cache, but finds /lib/x86_64-linux-gnu by default), copied
# through its symlinks. "not found" means the image could not run.
copy_libraries() {
  local bin=$1 line path
  local listing
  listing=$(ldd "$bin") || die "ldd $bin failed (not a dynamic executable?)"
  if grep -q "not found" <<<"$listing"; then
    die "ldd cannot find libraries of $bin:"$'\n'"$(grep "not found" <<<"$listing")"
  fi
  while read -r line; do
    case $line in
      *"=> /"*) path=${line#*=> }; path=${path%% (*} ;;  # libfoo.so.1 => /lib/.../libfoo.so.1 (0x..)
      /*) path=${line%% (*} ;;                          # /lib64/ld-linux-x86-64.so.2 (0x..)
      *) continue ;;                                    # linux-vdso.so.1 (in the kernel)
    esac
    mkdir -p "$context/runtime$(dirname "$path")"
    cp -L "$path" "$context/runtime$path"
  done <<<"$listing"
}
with_prometheus=0
if [ -x "$prometheus_bin" ] && [ -d "$prometheus_web" ]; then
  with_prometheus=1
  binaries+=("$prometheus_bin")
else
  echo "build_images: no $prometheus_bin (apt-get install prometheus): shardopt-prometheus not built" >&2
fi
for bin in "${binaries[@]}"; do copy_libraries "$bin"; done

cp "$server_bin" "$context/server/shardopt_server"
cp "$ctl_bin" "$context/server/shardoptctl"
cp "$mlp_trainer_bin" "$context/trainer/mlp_trainer"
cp "$test_trainer_bin" "$context/trainer/test_trainer"
chmod 0755 "$context"/server/* "$context"/trainer/*
if [ "$with_prometheus" = 1 ]; then
  cp "$prometheus_bin" "$context/prometheus/prometheus"
  chmod 0755 "$context/prometheus/prometheus"
  # The UI's files are links into /usr/share/javascript: copied as files,
  # without moment-timezone's 200 MB of raw time-zone data (the UI loads
  # its builds).
  tar -C "$prometheus_web/.." --dereference --exclude='moment-timezone/data' -cf - web |
    tar -C "$context/prometheus" -xf -
fi

build() {
  local image=$1 dockerfile=$2 dir=$3
  echo "build_images: building $image" >&2
  # The classic builder (DOCKER_BUILDKIT unset: there is no buildx here).
  local log
  log=$(DOCKER_BUILDKIT=0 "$docker" build --tag "$image" --build-arg "TAG=$tag" \
    --file "$here/$dockerfile" "$context/$dir" 2>&1) ||
    { echo "$log" >&2; echo "build_images: docker build of $image failed" >&2; exit 1; }
}
build "shardopt-runtime:$tag" runtime.Dockerfile runtime
build "shardopt-server:$tag" server.Dockerfile server
build "shardopt-trainer:$tag" trainer.Dockerfile trainer
images=("shardopt-runtime:$tag" "shardopt-server:$tag" "shardopt-trainer:$tag")
if [ "$with_prometheus" = 1 ]; then
  build "shardopt-prometheus:$tag" prometheus.Dockerfile prometheus
  images+=("shardopt-prometheus:$tag")
fi

# Sizes: the runtime's libraries are shared by the others.
for image in "${images[@]}"; do
  bytes=$("$docker" image inspect --format '{{.Size}}' "$image")
  printf 'build_images: %-28s %6.1f MB\n' "$image" "$(awk -v b="$bytes" 'BEGIN { print b / 1e6 }')"
done
