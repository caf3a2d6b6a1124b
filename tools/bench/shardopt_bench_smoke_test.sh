#!/bin/sh
# Smoke test for //tools/bench:shardopt_bench: runs it with tiny sizes and
# checks that every table row and the push+pull / raw-TCP ratio are printed.
# $1: the shardopt_bench binary.
set -u
bench="$1"
out="${TEST_TMPDIR:-/tmp}/shardopt_bench_smoke.out"

if ! "$bench" --sizes_mib=1 --optimizer_params=1048576 --seconds_per_case=0.2 \
    --pipeline_sizes_mib=8 --pipeline_rounds=1 --transport_sizes_mib=4 --transport_rounds=1 \
    --tcp_mib=64 --memcpy_mib=16 --wire_mib=1 >"$out" 2>"$out.stderr"; then
  echo "shardopt_bench failed; stdout:"; cat "$out"; echo "stderr:"; cat "$out.stderr"
  exit 1
fi
cat "$out"

status=0
expect() {
  # $1: description, $2: extended regular expression a line must match.
  if ! grep -Eq -- "$2" "$out"; then
    echo "MISSING: $1 (no line matches /$2/)"
    status=1
  fi
}
num='[0-9]+\.[0-9]+'
expect "header command line" '^  command: +.*--sizes_mib=1'
expect "header cpu" '^  cpu: +.+'
expect "TCP repetition rows" "^  repetition 1 +64 +$num +$num\$"
expect "TCP best row" "^  best \(used for ratios\) +$num\$"
expect "push+pull main row with ratio" "^  1 MiB +262144 +[0-9]+ +$num +$num +$num +2\.1 +$num +${num}x\$"
expect "push+pull breakdown row" "^  1 MiB +[0-9]+ +$num +$num +$num +$num +$num +$num +$num\$"
expect "memcpy row" "^  16 MiB +[0-9]+ +$num +$num\$"
for opt in adamw sgd-momentum adagrad; do
  expect "$opt row" "^  $opt +[0-9]+ +[0-9]+ +.* +$num +[0-9]+ +$num +$num +$num\$"
done
expect "lamb whole row" "^  whole tensors, 1 shard +[0-9]+ +$num +[0-9]+ +$num +$num\$"
expect "lamb flat row" "^  flat, 3 shards, norms gathered +[0-9]+ +$num +[0-9]+ +$num +$num\$"
expect "muon sgemm row" "^  1 sgemm 1024\^3 +[0-9]+ +$num +$num +1\.00\$"
expect "muon update row" "^  muon update, 1 x 1024x1024 +[0-9]+ +$num +$num +$num\$"
expect "summary ratio" "^  push\+pull 1 MiB: $num ms/step, $num GB/s payload = ${num}x raw TCP best\$"
expect "wire types fp32 row" "^  float32 / float32 +[0-9]+ +$num +$num +$num +1\\.000x +1\\.000x\$"
expect "wire types bf16 row" "^  bfloat16 / bfloat16 +[0-9]+ +$num +$num +$num +${num}x +${num}x\$"
expect "pipelining time split" "^  8 MiB +[0-9]+ +$num\.\.$num +\+-?$num +$num\.\.$num +(during|after)-push +$num\$"
for shape in whole server client both; do
  expect "pipelining $shape row" "^  8 MiB +$shape +[0-9]+ +$num +$num +${num}x +$num +${num}x\$"
done
for plane in grpc socket shm-copy shm; do
  expect "data plane $plane row" "^  4 MiB +$plane +[0-9]+ +$num +$num +$num +${num}x +${num}x +${num}x\$"
done
expect "data plane memcpy row" "^  4 MiB +memcpy +[0-9]+ +$num +$num +$num +- +1\.000x +${num}x\$"
expect "data plane raw TCP row" "^  4 MiB +raw TCP +[0-9]+ +$num +- +$num +- +${num}x +1\.000x\$"
expect "data plane target line" "^  4 MiB: shm vs memcpy by round: min ${num}x, median ${num}x, max ${num}x; target >= 0\.5x (met|NOT met) \(median\)\$"
expect "peak RSS" '^  peak RSS: [0-9]+ MiB'
exit $status
