#!/usr/bin/env bash
# Builds the GPU test, the host-emulation test and the GPU benchmark HERE
# (with Bazel, offline) and copies them into .gpu_bundle/ (git-ignored) with
# every shared library they load that is not part of the C library, so that a
# lent GPU machine with no gRPC/Abseil/GoogleTest and no package registry can
# run them: tools/gpu/gpu_check.sh runs them there.
#
#   bash tools/gpu/make_gpu_bundle.sh     # then carry .gpu_bundle to the GPU machine
#
# .gpu_bundle/
#   run.sh NAME ARGS...   runs bin/NAME with LD_LIBRARY_PATH=lib (which wins
#                         over the binaries' Bazel RUNPATH)
#   bin/                  fused_optimizers_test, fused_kernels_emulation_test,
#                         gpu_backend_test, gpu_bench, end_to_end_test with
#                         shardopt_server and test_trainer, optimizer_replay,
#                         nccl_pair_test with nccl_peer, nccl_bench (debug
#                         info stripped)
#   runfiles/             the layout end_to_end_test expects (TEST_SRCDIR)
#   binding/              the Python binding as a kit that
#                         tools/gpu/build_binding.sh compiles there against
#                         that machine's Python: its two sources, the headers
#                         they include (the project's, the generated protos',
#                         Debian's Abseil, protobuf, gRPC, and pybind11 2.10
#                         as a fallback), the shardopt package; what it links
#                         is lib/libshardopt_binding_deps.so
#   lib/                  the ldd-resolved libraries (Abseil, the Bazel solibs
#                         of the project's own libraries, libstdc++, libgcc_s)
#   MANIFEST              source fingerprint (tools/gpu/source_fingerprint.sh),
#                         git commit (+ dirty), build host, sizes, newest glibc
#                         symbol version needed
# CUDA's runtime is linked statically (libcudart_static.a); the driver
# (libcuda.so.1) is the GPU machine's own. GoogleTest is static here.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=tools/gpu/libraries_loaded.sh
source tools/gpu/libraries_loaded.sh

targets=(
  //server/cuda:fused_optimizers_test
  //server/cuda:fused_kernels_emulation_test
  //server/cuda:gpu_backend_test
  //tools/gpu:gpu_bench
  //tests:end_to_end_test
  //tests:device_pair_test
  //tests:test_trainer
  //server:shardopt_server
  //server/optim:optimizer_replay
  //common/nccl:nccl_pair_test
  //common/nccl:nccl_peer
  //tools/gpu:nccl_bench
  //tools/bench:device_pair_bench
  //python:libshardopt_binding_deps.so
)
# The sources before and after the build must agree: an edit made while
# Bazel ran would give a bundle whose fingerprint lies.
sources_before=$(bash tools/gpu/source_fingerprint.sh)
bazel build "${targets[@]}"
if [ "$(bash tools/gpu/source_fingerprint.sh)" != "$sources_before" ]; then
  echo "the sources changed during the build; run this again" >&2
  exit 1
fi
bin_root=$(bazel info bazel-bin 2>/dev/null)

bundle=.gpu_bundle
rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib"
binaries=(
  "$bin_root/server/cuda/fused_optimizers_test"
  "$bin_root/server/cuda/fused_kernels_emulation_test"
  "$bin_root/server/cuda/gpu_backend_test"
  "$bin_root/tools/gpu/gpu_bench"
  "$bin_root/tests/end_to_end_test"
  "$bin_root/tests/device_pair_test"
  "$bin_root/tests/test_trainer"
  "$bin_root/server/shardopt_server"
  "$bin_root/server/optim/optimizer_replay"
  "$bin_root/common/nccl/nccl_pair_test"
  "$bin_root/common/nccl/nccl_peer"
  "$bin_root/tools/gpu/nccl_bench"
  "$bin_root/tools/bench/device_pair_bench"
)

# Part of glibc (and the kernel's vDSO): always the GPU machine's own.
is_system() {
  case "$(basename "$1")" in
    linux-vdso.so.*|ld-linux*.so.*|libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|\
    libresolv.so.*|libutil.so.*|libcuda.so.*) return 0 ;;
  esac
  return 1
}

# Copies the libraries $1 loads (but the system's) into lib/.
copy_libraries_of() {
  local libs
  libs=$(libraries_loaded_by "$1") || exit 1
  while IFS= read -r lib; do
    is_system "$lib" && continue
    dest="$bundle/lib/$(basename "$lib")"
    [ -e "$dest" ] && continue
    cp -L "$lib" "$dest"
    chmod u+w "$dest"
    strip --strip-debug "$dest" 2>/dev/null || true
  done <<<"$libs"
}

for b in "${binaries[@]}"; do
  [ -x "$b" ] || { echo "missing $b" >&2; exit 1; }
  cp -L "$b" "$bundle/bin/"
  chmod u+w "$bundle/bin/$(basename "$b")"
  strip --strip-debug "$bundle/bin/$(basename "$b")"
  copy_libraries_of "$b"
done

# The binding's kit (see the header) and the library it links, with the
# libraries that one loads.
deps_library="$bin_root/python/libshardopt_binding_deps.so"
cp -L "$deps_library" "$bundle/lib/"
chmod u+w "$bundle/lib/libshardopt_binding_deps.so"
copy_libraries_of "$deps_library"
kit="$bundle/binding"
mkdir -p "$kit/include/google" "$kit/include/client" "$kit/include/common" \
  "$kit/include/python" "$kit/include/proto/shardopt/v1" "$kit/src" "$kit/shardopt" \
  "$kit/pybind11_include"
cp -r /usr/include/absl /usr/include/grpc /usr/include/grpcpp "$kit/include/"
cp -r /usr/include/google/protobuf "$kit/include/google/"
cp -r /usr/include/pybind11 "$kit/pybind11_include/"
cp client/*.h "$kit/include/client/"
cp common/*.h "$kit/include/common/"
cp python/py_conversions.h "$kit/include/python/"
cp "$bin_root"/proto/shardopt/v1/*.pb.h "$kit/include/proto/shardopt/v1/"
cp python/shardopt_module.cc python/py_conversions.cc "$kit/src/"
cp python/shardopt/*.py "$kit/shardopt/"

# The end-to-end test finds the server and trainer binaries through a
# runfiles tree ($TEST_SRCDIR/shardopt/...), as under `bazel test`.
mkdir -p "$bundle/runfiles/shardopt/server" "$bundle/runfiles/shardopt/tests"
ln -s ../../../bin/shardopt_server "$bundle/runfiles/shardopt/server/shardopt_server"
ln -s ../../../bin/test_trainer "$bundle/runfiles/shardopt/tests/test_trainer"

cat >"$bundle/run.sh" <<'WRAP'
#!/bin/sh
# Runs bin/NAME from this bundle with its libraries: run.sh NAME [ARGS...]
here=$(cd "$(dirname "$0")" && pwd)
name=$1
shift
# cuBLAS (Muon's products) and NCCL (the GPU data plane), both dlopen'ed
# and too big to carry, are the GPU machine's own: its CUDA toolkit's, or
# the ones PyTorch's wheels bring. (The wheels' layout varies:
# nvidia/cublas/lib, nvidia/nccl/lib, nvidia/cu13/lib, ...)
found_dirs=""
for lib in libcublas.so.13 libnccl.so.2; do
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
    $(python3 -c 'import glob, os, sys, nvidia
for root in nvidia.__path__:
    for f in glob.glob(os.path.join(root, "**", sys.argv[1]), recursive=True):
        print(os.path.dirname(f))' "$lib" 2>/dev/null); do
    if [ -e "$d/$lib" ]; then
      case ":$found_dirs:" in *":$d:"*) ;; *) found_dirs="$found_dirs:$d" ;; esac
      [ -n "${SHARDOPT_SHOW_CUBLAS:-}" ] && echo "$lib: $d" >&2
      break
    fi
  done
done
[ -n "${SHARDOPT_SHOW_CUBLAS:-}" ] && echo "library directories:${found_dirs:- none}" >&2
LD_LIBRARY_PATH="$here/lib$found_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/bin/$name" "$@"
WRAP
chmod +x "$bundle/run.sh"

glibc_needed=$(for f in "$bundle"/bin/* "$bundle"/lib/*; do
  objdump -T "$f" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' || true
done | sort -u -V | tail -1)
{
  echo "sources: $sources_before"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (plus uncommitted changes)')"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), $(/usr/local/cuda/bin/nvcc --version 2>/dev/null | tail -1)"
  echo "needs: glibc with $glibc_needed, an NVIDIA driver for CUDA 13, a GPU of compute capability >= 9.0"
  echo "size: $(du -sh "$bundle" | cut -f1)"
  (cd "$bundle" && find bin lib -type f -printf '%10s  %p\n' | sort -k2)
} >"$bundle/MANIFEST"
cat "$bundle/MANIFEST"
# What travels: the device tool carries at most 64 MiB, and the bundle is
# more than that since OpenBLAS joined it (36 MiB of it); gzip takes it to
# about a third. gpu_check.sh unpacks it there.
rm -f "$bundle.tgz"
tar -czf "$bundle.tgz" "$bundle"
echo "carry: $bundle.tgz ($(du -m "$bundle.tgz" | cut -f1) MiB)"
