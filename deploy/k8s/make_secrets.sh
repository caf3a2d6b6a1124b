#!/usr/bin/env bash
# make_secrets.sh: the TLS and auth-token Secrets of deploy/k8s, made with openssl.
#
# Usage: make_secrets.sh OUT_DIR [--shards=N] [--namespace=NS] [--days=N]
#
# Writes into OUT_DIR (created; refused when it already has files, so that a
# CA is never replaced by accident):
#   ca.crt ca.key                  a CA for this deployment only
#   server.crt server.key          SANs: every shard's name, shard-<i>.shardopt-shards
#                                  (what the trainers dial) and its longer forms
#   trainer.crt trainer.key        the trainers' client certificate (mutual TLS)
#   tokens trainer.token readonly.token   random auth tokens
#   secrets.yaml                   the three Secrets of secrets.example.yaml, filled in
# and prints the kubectl commands that install them. Nothing runs it
# automatically; keep OUT_DIR out of version control.
# --shards must be the StatefulSet's replicas (default 2): a shard without its
# name in the certificate fails every trainer's handshake.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'; }
die() { echo "make_secrets: $*" >&2; exit 2; }

out=""
shards=2
namespace=shardopt
days=365
# Must match base/: the StatefulSet, its headless Service, the Secret names.
statefulset=shard
service=shardopt-shards

for arg in "$@"; do
  case $arg in
    --help | -h) usage; exit 0 ;;
    --shards=*) shards=${arg#*=} ;;
    --namespace=*) namespace=${arg#*=} ;;
    --days=*) days=${arg#*=} ;;
    -*) die "unknown option $arg (see --help)" ;;
    *) [ -z "$out" ] || die "one OUT_DIR only"; out=$arg ;;
  esac
done
[ -n "$out" ] || { usage >&2; exit 2; }
[[ $shards =~ ^[1-9][0-9]*$ ]] || die "--shards=$shards is not a positive integer"
command -v openssl >/dev/null || die "openssl is not installed"
mkdir -p "$out"
[ -z "$(ls -A "$out")" ] || die "$out is not empty; pick a new directory"
cd "$out"
umask 077  # Private keys and tokens: readable by their owner only.

# Every name a client may use for shard i: the short one (same namespace, what
# trainer-job.yaml uses) up to the fully qualified one.
sans=""
for ((i = 0; i < shards; i++)); do
  host="$statefulset-$i.$service"
  for name in "$host" "$host.$namespace" "$host.$namespace.svc" "$host.$namespace.svc.cluster.local"; do
    sans+="${sans:+,}DNS:$name"
  done
done

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
# A leaf certificate signed by the CA: sign NAME CN EXTENDED_KEY_USAGE [SANS]
sign() {
  key "$1.key"
  openssl req -new -key "$1.key" -subj "/CN=$2" -out "$1.csr"
  {
    echo "basicConstraints = critical, CA:FALSE"
    echo "keyUsage = critical, digitalSignature"
    echo "extendedKeyUsage = $3"
    [ -z "${4:-}" ] || echo "subjectAltName = $4"
  } >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -set_serial "0x$(openssl rand -hex 16)" \
    -days "$days" -extfile "$1.ext" -out "$1.crt" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}

key ca.key
openssl req -x509 -new -key ca.key -subj "/CN=shardopt-ca ($namespace)" -days "$days" \
  -addext "basicConstraints = critical, CA:TRUE, pathlen:0" \
  -addext "keyUsage = critical, keyCertSign, cRLSign" -out ca.crt
sign server "$statefulset.$service.$namespace" serverAuth "$sans"
sign trainer shardopt-trainer clientAuth
chmod 0644 ca.crt server.crt trainer.crt

# No trailing newline: the file is the token.
openssl rand -hex 32 | tr -d "\n" >trainer.token
openssl rand -hex 32 | tr -d "\n" >readonly.token
printf 'trainer %s\nreadonly %s\n' "$(cat trainer.token)" "$(cat readonly.token)" >tokens

b64() { base64 -w0 <"$1"; }
tls_secret() {  # tls_secret NAME CERT_BASENAME
  printf -- '---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: %s\n  namespace: %s\n' "$1" "$namespace"
  printf 'type: kubernetes.io/tls\ndata:\n'
  printf '  tls.crt: %s\n  tls.key: %s\n  ca.crt: %s\n' "$(b64 "$2.crt")" "$(b64 "$2.key")" "$(b64 ca.crt)"
}
{
  tls_secret shardopt-server-tls server
  tls_secret shardopt-trainer-tls trainer
  printf -- '---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: shardopt-auth\n  namespace: %s\n' "$namespace"
  printf 'type: Opaque\ndata:\n'
  printf '  tokens: %s\n  trainer-token: %s\n  readonly-token: %s\n' \
    "$(b64 tokens)" "$(b64 trainer.token)" "$(b64 readonly.token)"
} >secrets.yaml

dir=$(pwd)
cat <<EOF
make_secrets: wrote $dir (server names: ${statefulset}-{0..$((shards - 1))}.${service}, with .${namespace}, .${namespace}.svc, .${namespace}.svc.cluster.local)
Install them (the namespace first, if it is new):
  kubectl create namespace $namespace --dry-run=client -o yaml | kubectl apply -f -
  kubectl apply -f $dir/secrets.yaml
or, the same with kubectl create:
  kubectl -n $namespace create secret generic shardopt-server-tls --type=kubernetes.io/tls \\
    --from-file=tls.crt=$dir/server.crt --from-file=tls.key=$dir/server.key --from-file=ca.crt=$dir/ca.crt
  kubectl -n $namespace create secret generic shardopt-trainer-tls --type=kubernetes.io/tls \\
    --from-file=tls.crt=$dir/trainer.crt --from-file=tls.key=$dir/trainer.key --from-file=ca.crt=$dir/ca.crt
  kubectl -n $namespace create secret generic shardopt-auth --from-file=tokens=$dir/tokens \\
    --from-file=trainer-token=$dir/trainer.token --from-file=readonly-token=$dir/readonly.token
EOF
