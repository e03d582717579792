#!/usr/bin/env bash
# Kills one component of the running local control plane with SIGKILL and starts it again with exactly
# the same command line (read from /proc), keeping etcd's data: what the fault tests use to restart
# kube-apiserver under a running hub. Prints, on stdout, the seconds (with millis) from the restart
# until the component is ready again (kube-apiserver: /readyz = ok; others: process alive).
#
#   tests/cluster/restart.sh kube-apiserver [down-seconds]
#
# down-seconds (default 0): how long the component stays dead before it is started again.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BIN=$HERE/bin
CL=$ROOT/.cluster
NAME=${1:?usage: restart.sh <component> [down-seconds]}
DOWN=${2:-0}
TIMEOUT=${CLUSTER_TIMEOUT:-120}

log() { printf '[cluster-restart] %s\n' "$*" >&2; }

pid=$(cat "$CL/pids/$NAME.pid")
[[ "$(readlink "/proc/$pid/exe" 2>/dev/null || true)" == "$BIN/"* ]] || { log "$NAME (pid $pid) is not running"; exit 1; }
mapfile -d '' cmd <"/proc/$pid/cmdline"
log "killing $NAME (pid $pid)"
kill -KILL "$pid"
while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
sleep "$DOWN"

log "starting $NAME again"
start=$(date +%s.%N)
setsid "${cmd[@]}" </dev/null >>"$CL/logs/$NAME.log" 2>&1 &
echo $! >"$CL/pids/$NAME.pid"

if [ "$NAME" = kube-apiserver ]; then
  API_PORT=$(sed -n 's/^CLUSTER_API_PORT=//p' "$CL/env")
  PKI=$CL/pki
  deadline=$((SECONDS + TIMEOUT))
  until [ "$(curl -sS --max-time 3 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
    "https://127.0.0.1:$API_PORT/readyz" 2>/dev/null)" = ok ]; do
    [ $SECONDS -lt $deadline ] || { log "FAILED: $NAME not ready after ${TIMEOUT}s"; exit 1; }
    sleep 0.1
  done
fi
python3 -c "import sys,time; print(f'{time.time() - float(sys.argv[1]):.3f}')" "$start"
