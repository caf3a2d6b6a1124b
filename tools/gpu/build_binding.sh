#!/usr/bin/env bash
# Compiles the Python binding (shardopt._shardopt) against THIS machine's
# Python, from the kit make_gpu_bundle.sh puts in .gpu_bundle/binding: the
# GPU machine's Python (3.12, with a CUDA torch) is not the Debian 3.11 the
# Bazel build targets, and pybind11 modules are built per Python version.
# Only the binding's own two files are compiled here; everything they call
# is the bundle's lib/libshardopt_binding_deps.so (built by Bazel, with the
# libraries it loads).
#
#   bash tools/gpu/build_binding.sh [BUNDLE]     # default .gpu_bundle
#
# Uses $PYTHON (default python3) for the headers and the module suffix, its
# pybind11 package when it has one (else the kit's, Debian's 2.10), and $CXX
# (default g++). Leaves BUNDLE/binding/shardopt/ importable (put
# BUNDLE/binding on PYTHONPATH and BUNDLE/binding/lib on LD_LIBRARY_PATH)
# and prints its path; exits 1 with the reason when it cannot.
set -euo pipefail
# shellcheck source=tools/gpu/libraries_loaded.sh
source "$(dirname "$0")/libraries_loaded.sh"
bundle=${1:-.gpu_bundle}
kit=$bundle/binding
python=${PYTHON:-python3}
cxx=${CXX:-g++}
[ -d "$kit/src" ] || { echo "build_binding: no $kit/src (make_gpu_bundle.sh makes it)"; exit 1; }
command -v "$cxx" >/dev/null || { echo "build_binding: no C++ compiler ($cxx)"; exit 1; }
py_include=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
[ -f "$py_include/Python.h" ] || { echo "build_binding: no Python.h in $py_include"; exit 1; }
suffix=$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
# pybind11: this Python's package; else the headers torch's wheel ships
# (a pip-installed torch brings no pybind11 package, and Debian's 2.10 in the
# kit predates Python 3.12), through a folder of their own (torch's include
# folder also holds protobuf headers that would hide the kit's); else the
# kit's.
torch_include=$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "include"))' 2>/dev/null || true)
if pybind11_include=$("$python" -c 'import pybind11; print(pybind11.get_include())' 2>/dev/null); then
  which_pybind11="this Python's pybind11 $("$python" -c 'import pybind11; print(pybind11.__version__)')"
elif [ -n "$torch_include" ] && [ -f "$torch_include/pybind11/pybind11.h" ]; then
  pybind11_include=$kit/torch_pybind11
  rm -rf "$pybind11_include"
  mkdir -p "$pybind11_include"
  ln -s "$torch_include/pybind11" "$pybind11_include/pybind11"
  which_pybind11="the pybind11 headers of torch's wheel"
else
  pybind11_include=$kit/pybind11_include
  which_pybind11="the kit's pybind11 (Debian's 2.10: Python 3.11 at most)"
fi
# Of the bundle's libraries, those the deps library loads, and not its C++
# runtime: a module built by this machine's compiler needs this machine's
# libstdc++ (newer), which the Python process (torch) has loaded already
# anyway; and the rest (OpenBLAS, ...) must not shadow the machine's own
# in a process that also runs torch.
bundle_lib=$(cd "$bundle/lib" && pwd)
rm -rf "$kit/lib"
mkdir -p "$kit/lib"
ln -s "$bundle_lib/libshardopt_binding_deps.so" "$kit/lib/"
if ! loads=$(LD_LIBRARY_PATH="$bundle_lib" libraries_loaded_by "$bundle_lib/libshardopt_binding_deps.so"); then
  echo "build_binding: the deps library's libraries do not resolve (above)"
  exit 1
fi
while IFS= read -r lib; do
  case "$lib" in "$bundle_lib"/*) ;; *) continue ;; esac
  case "$(basename "$lib")" in libstdc++.so*|libgcc_s.so*) continue ;; esac
  # (Nor zlib and OpenSSL where this machine has the same soname: Python's
  # _ssl and zlib modules need the machine's own.)
  case "$(basename "$lib")" in
    libz.so*|libssl.so*|libcrypto.so*)
      ldconfig -p 2>/dev/null | grep -q " $(basename "$lib") " && continue ;;
  esac
  ln -sf "$lib" "$kit/lib/"
done <<<"$loads"
out=$kit/shardopt/_shardopt$suffix
# (--no-as-needed: the module calls nothing in the deps library itself, only
# in the libraries it loads, so a linker that drops unused libraries by
# default, as Ubuntu's does, would leave them out.)
echo "build_binding: $("$python" --version 2>&1), $which_pybind11, $("$cxx" --version | head -1)"
"$cxx" -std=c++17 -O1 -g0 -fPIC -shared -fvisibility=hidden -fexceptions \
  -I"$py_include" -I"$pybind11_include" -I"$kit/include" \
  "$kit/src/shardopt_module.cc" "$kit/src/py_conversions.cc" \
  -L"$kit/lib" -Wl,-rpath-link,"$kit/lib" -Wl,--no-as-needed -lshardopt_binding_deps -o "$out"
echo "build_binding: built $out"
