#!/usr/bin/env bash
# docker_engine.sh start|stop|status: a Docker engine for the container tests.
#
# start   Does nothing when an engine already answers (`docker info`).
#         Otherwise starts dockerd in the background (needs root), records
#         its PID and what the host looked like before (which bridges and
#         iptables chains existed, the FORWARD policy, ip_forward), and polls
#         until the engine answers: at most SHARDOPT_DOCKER_START_TIMEOUT_S
#         (30) seconds, else it stops the half-started daemon, prints the
#         tail of its log and exits 1.
# stop    Stops only a dockerd that `start` started (the recorded PID, if it
#         is still that dockerd): SIGTERM, up to 20 s, then SIGKILL. Then
#         removes what it left: the docker0 and br-* bridges, the rules that
#         point at DOCKER chains or those bridges and the chains themselves,
#         the nftables tables iptables made for them, and (after a kill) the
#         mount of its data root, each only if it was not there before
#         `start`; FORWARD policy and ip_forward as they were. (After a kill,
#         containers that were still running are left to the next dockerd,
#         which cleans them up when it starts.) An engine someone else runs
#         is left alone.
# status  Says whether an engine answers and whether we started it; exit 0
#         when one answers, 1 otherwise.
# All three are idempotent. Exit 1 when start cannot give an engine (no
# dockerd, not root, it died or timed out); its last line says why.
#
# Environment: DOCKER_HOST (a unix:// socket: the engine to ask, and the one
# dockerd is told to listen on), SHARDOPT_DOCKERD_ARGS (more dockerd flags,
# e.g. --data-root/--exec-root/--pidfile for a second engine),
# SHARDOPT_DOCKER_STATE_DIR (PID, log and saved host state;
# default /tmp/shardopt-docker-engine).
set -uo pipefail

state_dir=${SHARDOPT_DOCKER_STATE_DIR:-/tmp/shardopt-docker-engine}
pid_file=$state_dir/dockerd.pid
log_file=$state_dir/dockerd.log
host_file=$state_dir/host-before
start_timeout_s=${SHARDOPT_DOCKER_START_TIMEOUT_S:-30}
stop_timeout_s=20
docker=${DOCKER:-docker}

say() { echo "docker_engine: $*" >&2; }

engine_answers() { timeout 10 "$docker" info >/dev/null 2>&1; }

# Whether process $1 runs (a zombie does not: start's own child is one
# until bash reaps it).
alive() { local s; s=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) && [ "$s" != Z ]; }

# The PID we recorded, if that process is still the dockerd we started (a
# reused PID belongs to someone else).
our_pid() {
  [ -f "$pid_file" ] || return 1
  local pid
  pid=$(cat "$pid_file")
  [ -n "$pid" ] && alive "$pid" && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ] && echo "$pid"
}

bridges() { ip -o link show type bridge 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//'; }
nft_tables() { command -v nft >/dev/null && nft list tables 2>/dev/null; }

# dockerd's data root (it bind-mounts it onto itself while it runs).
data_root() {
  local arg root=/var/lib/docker
  for arg in ${SHARDOPT_DOCKERD_ARGS:-}; do
    case $arg in --data-root=*) root=${arg#*=} ;; esac
  done
  echo "$root"
}

# What stop must put back, as KEY=VALUE lines.
save_host_state() {
  {
    echo "ip_forward=$(cat /proc/sys/net/ipv4/ip_forward 2>/dev/null)"
    echo "forward_policy=$(iptables -S FORWARD 2>/dev/null | awk '$1 == "-P" {print $3}')"
    for t in filter nat; do
      echo "chains_$t=$(iptables -t "$t" -S 2>/dev/null | awk '/^-N DOCKER/ {printf "%s ", $2}')"
    done
    echo "bridges=$(bridges | tr '\n' ' ')"
    echo "nft_tables=$(nft_tables | tr '\n' ',')"
    echo "data_root_mounted=$(mountpoint -q "$(data_root)" && echo yes)"
  } >"$host_file"
}

saved() { sed -n "s/^$1=//p" "$host_file" 2>/dev/null; }

# Removes the docker rules and chains of iptables table $1.
remove_docker_rules() {
  local t=$1 rule chain
  local -a words
  # Rules in the built-in chains that jump to DOCKER* or match a docker
  # bridge (docker0, br-<12 hex>): FORWARD, nat PREROUTING/OUTPUT/POSTROUTING.
  iptables -t "$t" -S 2>/dev/null |
    grep -E '^-A (INPUT|OUTPUT|FORWARD|PREROUTING|POSTROUTING) ' |
    grep -E 'DOCKER|docker0|br-[0-9a-f]{12}' |
    while read -r rule; do
      read -ra words <<<"$rule"
      iptables -t "$t" -D "${words[@]:1}" || say "could not remove iptables -t $t rule: $rule"
    done
  for chain in $(iptables -t "$t" -S 2>/dev/null | awk '/^-N DOCKER/ {print $2}'); do
    iptables -t "$t" -F "$chain"
  done
  for chain in $(iptables -t "$t" -S 2>/dev/null | awk '/^-N DOCKER/ {print $2}'); do
    iptables -t "$t" -X "$chain" || say "could not remove iptables -t $t chain $chain"
  done
}

# Puts back what `start` found (see save_host_state).
restore_host_state() {
  [ -f "$host_file" ] || return 0
  local b t
  for b in $(bridges); do
    if [[ $b == docker0 || $b =~ ^br-[0-9a-f]{12}$ ]] && [[ " $(saved bridges) " != *" $b "* ]]; then
      ip link delete "$b" || say "could not remove bridge $b"
    fi
  done
  for t in filter nat; do
    [ -z "$(saved "chains_$t")" ] && remove_docker_rules "$t"
  done
  local policy
  policy=$(saved forward_policy)
  [ -n "$policy" ] && iptables -P FORWARD "$policy"
  # iptables-nft made these tables for docker's rules; drop them when they
  # are new and hold nothing but empty built-in chains with policy ACCEPT.
  for t in filter nat; do
    if nft_tables | grep -qx "table ip $t" && [[ ",$(saved nft_tables)," != *",table ip $t,"* ]] &&
      ! iptables -t "$t" -S | grep -qv '^-P [A-Z]* ACCEPT$'; then
      nft delete table ip "$t" || say "could not remove nftables table ip $t"
    fi
  done
  # A dockerd that had to be killed leaves its data root mounted on itself.
  if [ -z "$(saved data_root_mounted)" ] && mountpoint -q "$(data_root)"; then
    umount "$(data_root)" || say "could not unmount $(data_root)"
  fi
  local forward
  forward=$(saved ip_forward)
  [ -n "$forward" ] && echo "$forward" >/proc/sys/net/ipv4/ip_forward
  rm -f "$host_file"
}

start() {
  if engine_answers; then
    if pid=$(our_pid); then say "engine up (dockerd pid $pid, started by us)"; else say "engine up (not started by us)"; fi
    return 0
  fi
  if pid=$(our_pid); then
    say "our dockerd (pid $pid) does not answer; restarting it"
    stop || return 1
  fi
  local dockerd
  dockerd=$(command -v dockerd) || { say "no dockerd on PATH (Debian: apt-get install docker.io)"; return 1; }
  [ "$(id -u)" -eq 0 ] || { say "dockerd needs root (running as $(id -un))"; return 1; }
  mkdir -p "$state_dir"
  # A previous run that died without `stop` left its host state: keep that
  # (it describes the host before any of our engines).
  [ -f "$host_file" ] || save_host_state
  local -a args=(--shutdown-timeout=5)
  [[ ${DOCKER_HOST:-} == unix://* ]] && args+=(--host="$DOCKER_HOST")
  # shellcheck disable=SC2206  # word splitting wanted: a list of flags
  args+=(${SHARDOPT_DOCKERD_ARGS:-})
  # setsid: its own session, so a Ctrl-C of the caller does not reach it.
  # (Not a process group leader here, setsid execs dockerd in place: $! is
  # dockerd's PID.)
  setsid "$dockerd" "${args[@]}" </dev/null >"$log_file" 2>&1 &
  local pid=$!
  echo "$pid" >"$pid_file"
  say "started dockerd (pid $pid, log $log_file); waiting up to ${start_timeout_s}s for it to answer"
  local give_up=$((SECONDS + start_timeout_s))
  until engine_answers; do
    if ! alive "$pid"; then
      tail -n 20 "$log_file" >&2
      say "dockerd exited during start-up (the end of its log is above): $(tail -n 1 "$log_file")"
      rm -f "$pid_file"
      restore_host_state
      return 1
    fi
    # (By the clock: each probe may itself take up to 10 s.)
    if ((SECONDS >= give_up)); then
      tail -n 20 "$log_file" >&2
      stop
      say "dockerd did not answer 'docker info' within ${start_timeout_s}s (the end of its log is above)"
      return 1
    fi
    sleep 0.5
  done
  say "engine up (dockerd pid $pid) after $((start_timeout_s - give_up + SECONDS))s"
}

stop() {
  local pid
  if ! pid=$(our_pid); then
    if [ -f "$pid_file" ]; then say "our dockerd is gone already"; fi
    rm -f "$pid_file"
    restore_host_state
    engine_answers && say "an engine we did not start is running: left alone"
    return 0
  fi
  # Its containerd, in case it has to be killed: SIGKILL leaves children.
  local -a children
  mapfile -t children < <(pgrep -P "$pid" 2>/dev/null)
  kill -TERM "$pid"
  local waited=0
  while alive "$pid" && ((waited < stop_timeout_s * 10)); do
    sleep 0.1
    waited=$((waited + 1))
  done
  if alive "$pid"; then
    say "dockerd (pid $pid) still running ${stop_timeout_s}s after SIGTERM: killing it"
    kill -KILL "$pid" "${children[@]}" 2>/dev/null
    waited=0
    while alive "$pid" && ((waited < 50)); do
      sleep 0.1
      waited=$((waited + 1))
    done
  fi
  rm -f "$pid_file"
  restore_host_state
  say "stopped dockerd (pid $pid)"
}

status() {
  local pid
  if engine_answers; then
    if pid=$(our_pid); then say "engine up (dockerd pid $pid, started by us)"; else say "engine up (not started by us)"; fi
    return 0
  fi
  if pid=$(our_pid); then say "our dockerd (pid $pid) runs but does not answer"; else say "no engine"; fi
  return 1
}

case ${1:-} in
  start | stop | status) "$1" ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
