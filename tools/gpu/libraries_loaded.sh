# Sourced by make_gpu_bundle.sh (here) and build_binding.sh (on the GPU
# machine): one reading of ldd for both.
#
# libraries_loaded_by FILE: the paths of the shared libraries FILE loads,
# one a line (ldd's "name => /path (0x...)" lines; a path may hold spaces),
# as the caller's LD_LIBRARY_PATH resolves them. Fails, saying why on
# stderr, when ldd does or when a library is "not found".
libraries_loaded_by() {
  local answer
  if ! answer=$(ldd "$1" 2>&1); then
    echo "ldd of $1 failed: $answer" >&2
    return 1
  fi
  if grep -q "not found" <<<"$answer"; then
    echo "$answer" >&2
    echo "unresolved libraries for $1" >&2
    return 1
  fi
  sed -n 's/^[[:space:]]*[^ ]* => \(\/.*\) (0x[0-9a-f]*)$/\1/p' <<<"$answer"
}
