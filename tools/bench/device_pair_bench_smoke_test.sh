#!/bin/sh
# Smoke test for //tools/bench:device_pair_bench on loopback pairs (a CPU
# server): tiny sizes, one round; every plane's row is printed, the pairs
# carried every transfer (the bench fails otherwise).
# $1: device_pair_bench, $2: shardopt_server.
set -u
out="${TEST_TMPDIR:-/tmp}/device_pair_bench_smoke.out"
if ! "$1" --server="$2" --device=cpu --kind=loopback --sizes_mib=1,4 --rounds=1 \
    --seconds_per_case=0.2 >"$out" 2>&1; then
  echo "device_pair_bench failed:"; cat "$out"; exit 1
fi
cat "$out"
status=0
num='[0-9]+\.[0-9]+'
for size in 1 4; do
  for plane in grpc socket pairs; do
    if ! grep -Eq "^  $size MiB +$plane +[0-9]+ +$num +$num +$num +${num}x\$" "$out"; then
      echo "MISSING: the $size MiB row of $plane"
      status=1
    fi
  done
done
exit $status
