#!/bin/sh
# pslite_compare.py without a ps-lite source (CI has none): the shardopt job
# jobs (gRPC, payload socket and shared memory) and raw TCP run and the table has their rows. $1: pslite_compare.py,
# $2: shardopt_server, $3: _shardopt.so, $4: shardopt_bench.
set -eu
export PYTHONPATH="$PWD/python:$(dirname "$PWD/$3")"
out="${TEST_TMPDIR:-/tmp}/pslite_compare.out"
if ! /usr/bin/python3 "$PWD/$1" --sizes_mib=1 --rounds=1 --seconds=0.2 --tcp_mib=16 \
    --server_binary="$PWD/$2" --bench_binary="$PWD/$4" >"$out" 2>&1; then
  echo "pslite_compare failed:"; cat "$out"; exit 1
fi
cat "$out"
grep -Eq '^ +1 MiB  shardopt +[0-9.]+ +[0-9.]+ +[0-9.]+x +[0-9.]+x +[0-9.]+x *$' "$out" || { echo "no shardopt row"; exit 1; }
grep -Eq '^ +1 MiB  shardopt socket +[0-9.]+ +[0-9.]+ +[0-9.]+x +[0-9.]+x +[0-9.]+x *$' "$out" || { echo "no shardopt socket row"; exit 1; }
grep -Eq '^ +1 MiB  shardopt shm +[0-9.]+ +[0-9.]+ +[0-9.]+x +[0-9.]+x +[0-9.]+x *$' "$out" || { echo "no shardopt shm row"; exit 1; }
grep -q 'raw TCP [0-9.]* GB/s' "$out" || { echo "no raw TCP figure"; exit 1; }
grep -Eq '^ +1 MiB  shardopt socket +[0-9.]+x / [0-9.]+x / [0-9.]+x$' "$out" || { echo "no round-by-round socket ratios"; exit 1; }
