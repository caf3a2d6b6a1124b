#!/usr/bin/env bash
# manifests_test: deploy/k8s, offline (no cluster runs here).
#  1. make_secrets.sh's Secrets are generated (openssl) into the test's temp dir;
#  2. kubernetes-validate --strict checks every manifest and those Secrets
#     against the API schemas of Kubernetes 1.28 (the oldest these manifests
#     need: the pod-index label) and 1.37 (the newest the tool knows);
#  3. check_manifests.py checks that the objects agree with each other and
#     with the certificates, then breaks them on purpose to see that it notices.
# Needs SHARDOPT_VENV (tools/run_tests.sh passes it: --test_env=SHARDOPT_VENV=
# .../.venv-tools); without it the test fails rather than skips, since
# unvalidated manifests would look like validated ones.
# Usage: manifests_test.sh K8S_DIR
set -euo pipefail

dir=$1
fail() { echo "manifests_test: FAIL: $*" >&2; exit 1; }

validate=${SHARDOPT_VENV:-}/bin/kubernetes-validate
if [ -z "${SHARDOPT_VENV:-}" ] || [ ! -x "$validate" ]; then
  fail "no kubernetes-validate at '$validate': run with --test_env=SHARDOPT_VENV=/path/to/.venv-tools (tools/setup.sh installs it)"
fi
command -v openssl >/dev/null || fail "openssl is not installed (tools/setup.sh installs it)"

tmp=${TEST_TMPDIR:-$(mktemp -d)}
secrets=$tmp/secrets
rm -rf "$secrets"
bash "$dir/make_secrets.sh" "$secrets" >/dev/null || fail "make_secrets.sh failed"

# kustomization.yaml is no API object (the tool would only warn about it).
manifests=()
for f in "$dir"/base/*.yaml "$dir/secrets.example.yaml" "$secrets/secrets.yaml"; do
  [ "$(basename "$f")" = kustomization.yaml ] || manifests+=("$f")
done
log=$tmp/validate.log
rc=0
"$validate" --strict -k 1.28.0 -k 1.37.0 "${manifests[@]}" >"$log" 2>&1 || rc=$?
cat "$log"
# An unknown kind or apiVersion is only a WARN, with exit 0: count it as a failure.
if [ "$rc" != 0 ] || grep -qv '^INFO ' "$log"; then fail "kubernetes-validate rc=$rc"; fi
for f in "${manifests[@]}"; do
  grep -q "^INFO $f passed" "$log" || fail "kubernetes-validate checked nothing in $f"
done

"$SHARDOPT_VENV/bin/python3" "$dir/check_manifests.py" "$dir" --secrets="$secrets" --self_test ||
  fail "check_manifests.py"
echo "manifests_test: PASS (${#manifests[@]} files)"
