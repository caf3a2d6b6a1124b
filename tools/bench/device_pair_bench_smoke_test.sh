#!/bin/sh
# Smoke test for //tools/bench:device_pair_bench on loopback pairs (a CPU
# server): tiny sizes, one round, host and device buffers; every plane's
# row is printed, the pairs carried every transfer (from and into the
# device buffers themselves with --device_buffers; the bench fails
# otherwise).
# $1: device_pair_bench, $2: shardopt_server.
set -u
out="${TEST_TMPDIR:-/tmp}/device_pair_bench_smoke.out"
status=0
for buffers in --nodevice_buffers --device_buffers; do
  if ! "$1" --server="$2" --device=cpu --kind=loopback --sizes_mib=1,4 --rounds=1 \
      --seconds_per_case=0.2 "$buffers" >"$out" 2>&1; then
    echo "device_pair_bench $buffers failed:"; cat "$out"; exit 1
  fi
  cat "$out"
  num='[0-9]+\.[0-9]+'
  for size in 1 4; do
    for plane in grpc socket pairs; do
      if ! grep -Eq "^  $size MiB +$plane +[0-9]+ +$num +$num +$num +${num}x\$" "$out"; then
        echo "MISSING: the $size MiB row of $plane"
        status=1
      fi
    done
  done
done
exit $status
