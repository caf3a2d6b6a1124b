#!/bin/sh
# tools/testing/watchdog.py: a test that finishes keeps its exit status; one that hangs
# with a shard server under it ends, within the deadline, with the server's
# and the test's native stacks (shardopt frames named), the end of the
# server's log file, the test's Python stack and a FAIL line.
# $1: the shardopt_server binary. Runs in the runfiles root.
set -u
export SHARDOPT_SERVER="$PWD/$1"
watchdog="$PWD/tools/testing/watchdog.py"
# (This test may run under a watchdog itself: tools/run_tests.sh.)
unset SHARDOPT_UNDER_WATCHDOG
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; [ -f "$work/out" ] && sed 's/^/  | /' "$work/out"; exit 1; }

echo 'import sys; print("done"); sys.exit(3)' >"$work/exits.py"
TEST_TIMEOUT=60 /usr/bin/python3 "$watchdog" /usr/bin/python3 -u "$work/exits.py" >"$work/out" 2>&1
rc=$?
[ "$rc" = 3 ] || fail "a test that exits 3 gave $rc"
grep -q '^done$' "$work/out" || fail "the test's output did not come through"
echo "ok   a finished test's exit status and output come through"

# Under a watchdog already, it only runs its command (one deadline, one report).
SHARDOPT_UNDER_WATCHDOG=1 TEST_TIMEOUT=1 /usr/bin/python3 "$watchdog" /bin/sh -c 'sleep 2; exit 4' \
  >"$work/out" 2>&1
rc=$?
[ "$rc" = 4 ] || fail "a watchdog under a watchdog gave $rc, not the command's 4"
echo "ok   a watchdog under a watchdog only runs its command"

cat >"$work/hangs.py" <<PY
import sys, time
sys.path.insert(0, "$PWD/python/tests")
from support import Cluster
with Cluster(1) as cluster:
    print("cluster up", flush=True)
    time.sleep(300)  # Ended by the watchdog well before this.
PY
start=$(date +%s)
# TEST_TIMEOUT=11: the watchdog acts a tenth before it, at its least, 10 s.
TEST_TIMEOUT=11 /usr/bin/python3 "$watchdog" /usr/bin/python3 -u -X faulthandler "$work/hangs.py" >"$work/out" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
[ "$rc" = 1 ] || fail "a hanging test gave exit status $rc, not 1"
[ "$took" -lt 60 ] || fail "the watchdog took $took s"
grep -q 'did not finish within 10 s' "$work/out" || fail "no line naming the deadline"
grep -q 'shardopt_server' "$work/out" || fail "the server process is not listed"
grep -q 'shardopt::RunShardServer' "$work/out" || fail "no native stack of the server"
grep -q 'watchdog: .*/cluster.*/server0.log, last' "$work/out" || fail "no tail of the server's log file"
grep -q 'hangs.py", line 6' "$work/out" || fail "no Python stack of the test"
grep -q 'watchdog: FAIL: hangs.py timed out after 10 s' "$work/out" || fail "no FAIL line"
[ -z "$(pgrep -f "$work" 2>/dev/null)" ] || fail "processes of the test are left"
echo "ok   a hanging test ends after ${took} s with its processes' stacks and a FAIL line"
