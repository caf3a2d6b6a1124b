#!/bin/sh
# ddp_compare.py with a tiny model: every job runs and the table has their
# rows and the ratio. $1: ddp_compare.py, $2: shardopt_server, $3: _shardopt.so.
set -eu
export PYTHONPATH="$PWD/python:$(dirname "$PWD/$3")"
out="${TEST_TMPDIR:-/tmp}/ddp_compare.out"
if ! /usr/bin/python3 "$PWD/$1" --params=65536 --steps=2 --rounds=1 \
    --server_binary="$PWD/$2" >"$out" 2>&1; then
  echo "ddp_compare failed:"; cat "$out"; exit 1
fi
cat "$out"
grep -Eq '^  ddp +2 +[0-9.]+ +[0-9.]+ +[0-9.]+ +1\.00x$' "$out" || { echo "no ddp row"; exit 1; }
grep -Eq '^  shardopt +2 +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+x$' "$out" || { echo "no shardopt row"; exit 1; }
grep -Eq '^  shardopt-socket +2 +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+x$' "$out" || { echo "no shardopt-socket row"; exit 1; }
grep -Eq '^  shardopt-grpc +2 +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+x$' "$out" || { echo "no shardopt-grpc row"; exit 1; }
