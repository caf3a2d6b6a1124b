#!/bin/sh
# The main job (lm_job.py) shortened to a tiny model: it must PASS, write the
# plot (a PNG) and the two loss curves, which must agree; and a run whose loss
# cannot fall (lr 0) must FAIL with exit 1 (run with --no_overlap_backward: it
# then sends nothing during backward); a bounded-staleness run with a slow
# trainer passes within its bound; Lion, LAMB, Adafactor and Muon (the last
# three on the whole_tensors partition) train it on 2 trainers x 3 shards and
# its loss falls.
# $1: lm_job.py, $2: shardopt_server, $3: _shardopt.so.
set -eu
job="$PWD/$1"
server="$PWD/$2"
export PYTHONPATH="$PWD/python:$(dirname "$PWD/$3")"
out="${TEST_TMPDIR:-/tmp}/lm_job"
tiny="--steps=12 --width=32 --layers=1 --heads=2 --context=16 --batch=8 --corpus_bytes=200000"

if ! /usr/bin/python3 "$job" $tiny --min_drop=0.2 --server_binary="$server" --out="$out" \
    >"$out.log" 2>&1; then
  echo "the job failed:"; cat "$out.log"; exit 1
fi
cat "$out.log"
grep -q '^PASS$' "$out.log" || { echo "no PASS line"; exit 1; }
grep -q 'step   12/12' "$out.log" || { echo "no progress line for the last step"; exit 1; }
head -c 8 "$out/loss.png" | od -An -tx1 | grep -q '89 50 4e 47 0d 0a 1a 0a' ||
  { echo "loss.png is not a PNG"; exit 1; }
rows=$(tail -n +2 "$out/losses.csv" | wc -l)
[ "$rows" -eq 12 ] || { echo "losses.csv has $rows rows, not 12"; exit 1; }
/usr/bin/python3 - "$out/losses.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
gap = max(abs(float(r["shardopt"]) - float(r["torch_optim"])) for r in rows)
assert gap < 0.05, f"the curves differ by {gap}"
assert float(rows[-1]["shardopt"]) < float(rows[0]["shardopt"]), "the loss did not fall"
print(f"curves agree to {gap:.2e}")
PY

if /usr/bin/python3 "$job" $tiny --lr=0 --no_overlap_backward --server_binary="$server" \
    --out="$out.lr0" >"$out.lr0.log" 2>&1; then
  echo "a job with lr 0 passed:"; cat "$out.lr0.log"; exit 1
fi
grep -q 'FAIL: the loss did not go down' "$out.lr0.log" ||
  { echo "lr 0: not the expected failure:"; cat "$out.lr0.log"; exit 1; }
grep -q ' 0% of the push sent during backward' "$out.lr0.log" ||
  { echo "--no_overlap_backward: something was sent during backward:"; cat "$out.lr0.log"; exit 1; }
# Bounded staleness with trainer 1 three times slower: it passes, reports the
# mode, and no push ran more than 2 steps ahead.
if ! /usr/bin/python3 "$job" $tiny --min_drop=0.2 --consistency=bounded --staleness=2 \
    --slowdown=3 --server_binary="$server" --out="$out.bounded" >"$out.bounded.log" 2>&1; then
  echo "the bounded job failed:"; cat "$out.bounded.log"; exit 1
fi
grep -q '^PASS$' "$out.bounded.log" || { echo "bounded: no PASS line"; cat "$out.bounded.log"; exit 1; }
grep -q 'consistency: bounded (staleness 2)' "$out.bounded.log" ||
  { echo "bounded: no consistency line"; cat "$out.bounded.log"; exit 1; }
/usr/bin/python3 - "$out.bounded/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert s["consistency"] == "bounded", s
assert 1 <= s["max_staleness"] <= 2, f"staleness {s['max_staleness']} outside [1, 2]"
assert s["eval_loss"] < s["torch_eval_loss"] + 1.0, s
print(f"bounded: largest staleness {s['max_staleness']}, held-out loss {s['eval_loss']:.3f}")
PY
for spec in "lion 0.003" "lamb 0.02" "adafactor 0.05" "muon 0.05"; do
  set -- $spec
  if ! /usr/bin/python3 "$job" $tiny --min_drop=0.2 --optimizer="$1" --lr="$2" --shards=3 \
      --server_binary="$server" --out="$out.$1" >"$out.$1.log" 2>&1; then
    echo "the $1 job failed:"; cat "$out.$1.log"; exit 1
  fi
  grep -q '^PASS$' "$out.$1.log" || { echo "$1: no PASS line"; cat "$out.$1.log"; exit 1; }
  grep -q "$1 lr $2; 2 trainers x 3 shards" "$out.$1.log" ||
    { echo "$1: not 2 trainers x 3 shards with $1:"; cat "$out.$1.log"; exit 1; }
  /usr/bin/python3 - "$out.$1/summary.json" "$1" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert s["optimizer"] == sys.argv[2] and s["shards"] == 3, s
print(f"{s['optimizer']}: held-out loss {s['eval_loss']:.3f}")
PY
done
echo "lm_job_test: ok"
