#!/bin/sh
# connections_compare.py on a tiny model: the raw TCP line with 2 and 4
# connections and the 1-vs-2-shard rows. $1: connections_compare.py,
# $2: shardopt_server, $3: _shardopt.so, $4: shardopt_bench.
set -eu
export PYTHONPATH="$PWD/python:$(dirname "$PWD/$3")"
out="${TEST_TMPDIR:-/tmp}/connections_compare.out"
if ! /usr/bin/python3 "$PWD/$1" --sizes_mib=1 --rounds=1 --seconds=0.2 --tcp_mib=16 \
    --server_binary="$PWD/$2" --bench_binary="$PWD/$4" >"$out" 2>&1; then
  echo "connections_compare failed:"; cat "$out"; exit 1
fi
cat "$out"
grep -Eq '^raw TCP loopback.*2 at once [0-9.]+ GB/s.*4 at once [0-9.]+ GB/s' "$out" || { echo "no raw TCP line"; exit 1; }
grep -Eq '^ +1 MiB +[0-9.]+ +[0-9.]+ +[0-9.]+x$' "$out" || { echo "no 1 MiB row"; exit 1; }
