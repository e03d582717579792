#!/usr/bin/env bash
# Stops the local control plane started by up.sh and removes <repo>/.cluster/.
# Kills only our own processes: those named in .cluster/pids/*.pid, plus any stray process
# whose executable is in tests/cluster/bin/ and whose command line points into .cluster/
# (e.g. if up.sh was interrupted between starting a process and writing its pid file).
# TERM first, KILL after DOWN_GRACE seconds (default 5). Safe to run when nothing is up.
#
#   --keep-logs   keep .cluster/logs (up.sh uses this after a failed start)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BIN=$HERE/bin
CL=${CLUSTER_DIR:-$ROOT/.cluster} # as up.sh
GRACE=${DOWN_GRACE:-5}
KEEP_LOGS=0
[ "${1:-}" = --keep-logs ] && KEEP_LOGS=1

log() { printf '[cluster-down] %s\n' "$*" >&2; }

if [ "${CLUSTER_LOCK_HELD:-0}" != 1 ]; then
  mkdir -p "$BIN"
  exec 9>"$BIN/.cluster.lock"
  flock -w 600 9 || { log "another up.sh/down.sh holds $BIN/.cluster.lock"; exit 1; }
fi

ours() { # <pid>: alive and running one of our binaries
  kill -0 "$1" 2>/dev/null && [[ "$(readlink "/proc/$1/exe" 2>/dev/null || true)" == "$BIN/"* ]]
}

# TERM, wait up to GRACE seconds, then KILL, for one group of pids.
stop() { # <label> pids...
  local label=$1 deadline pid left
  shift
  [ $# -gt 0 ] || return 0
  log "stopping $label (pid $*)"
  kill -TERM "$@" 2>/dev/null || true
  deadline=$((SECONDS + GRACE))
  while :; do
    left=()
    for pid in "$@"; do if ours "$pid"; then left+=("$pid"); fi; done
    [ ${#left[@]} -gt 0 ] || return 0
    [ $SECONDS -lt $deadline ] || break
    sleep 0.2
  done
  log "still alive after ${GRACE}s, sending KILL: ${left[*]}"
  kill -KILL "${left[@]}" 2>/dev/null || true
  sleep 0.5
}

pid_of() { # <name>: pid from the pid file, if it is still our process
  local f=$CL/pids/$1.pid pid
  [ -s "$f" ] || return 0
  pid=$(cat "$f")
  if ours "$pid"; then echo "$pid"; fi
}

# Directories the host-path provisioner made for this cluster's PersistentVolumes (KCM removes a
# volume's directory when its claim is deleted, but not when the whole cluster goes away). Listed
# while the apiserver still answers, removed once KCM is stopped. Best effort: a dead apiserver
# leaves them (empty directories under /tmp/hostpath_pv/).
provisioned_dirs() {
  local port
  port=$(sed -n 's/^CLUSTER_API_PORT=//p' "$CL/env" 2>/dev/null || true)
  [ -n "$port" ] && [ -n "$(pid_of kube-apiserver)" ] || return 0
  curl -sS --fail --max-time 5 --cacert "$CL/pki/ca.crt" --cert "$CL/pki/admin.crt" --key "$CL/pki/admin.key" \
    "https://127.0.0.1:$port/api/v1/persistentvolumes" 2>/dev/null | python3 -c '
import json, re, sys
for pv in json.load(sys.stdin)["items"]:
    path = (pv["spec"].get("hostPath") or {}).get("path", "")
    ours = pv["metadata"].get("annotations", {}).get("pv.kubernetes.io/provisioned-by") == "kubernetes.io/host-path"
    if ours and re.fullmatch(r"/tmp/hostpath_pv/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", path):
        print(path)' 2>/dev/null || true
}
mapfile -t pv_dirs < <(provisioned_dirs)

# The real node (node-up.sh) first: its kubelet, containers, mounts, cgroups and iptables chains.
if [ -d "$CL/node" ]; then CLUSTER_LOCK_HELD=1 bash "$HERE/node-down.sh" || true; fi

# Reverse dependency order: clients first, then the apiserver, etcd last. (An apiserver whose
# etcd vanished first can hang in shutdown for a long time.)
# shellcheck disable=SC2046 # word splitting of pid lists is intended
{
  stop "kwok, kube-scheduler, kube-controller-manager" $(pid_of kwok) $(pid_of kube-scheduler) $(pid_of kube-controller-manager)
  stop kube-apiserver $(pid_of kube-apiserver)
  stop etcd $(pid_of etcd)
}

if [ ${#pv_dirs[@]} -gt 0 ]; then
  log "removing ${#pv_dirs[@]} host-path volume directories under /tmp/hostpath_pv"
  rm -rf -- "${pv_dirs[@]}"
fi

# Strays: our binary, with .cluster/ on its command line.
strays=()
for p in /proc/[0-9]*; do
  pid=${p#/proc/}
  ours "$pid" || continue
  tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -qF "$CL/" || continue
  strays+=("$pid")
done
stop "stray processes" "${strays[@]}"

if [ -d "$CL" ]; then
  if [ $KEEP_LOGS = 1 ]; then
    find "$CL" -mindepth 1 -maxdepth 1 ! -name logs -exec rm -rf {} +
  else
    rm -rf "$CL"
  fi
fi
log "down"
