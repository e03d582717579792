#!/usr/bin/env bash
# Smoke test of a running local control plane (start it with `make cluster-up` first):
# readyz, nodes Ready, Deployment -> Pods Running/Ready, GC of ReplicaSet+Pods on Deployment
# delete, Job completes, StatefulSet claims provisioned by the default StorageClass, Namespace deletion. Uses its own namespace; exits non-zero on failure.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
export KUBECONFIG=${KUBECONFIG:-$ROOT/.cluster/kubeconfig}
K=$HERE/bin/kubectl
NS=smoke-$$
N=${FAKE_NODES:-2}

step() { printf '[cluster-smoke] %s\n' "$*" >&2; }
die() { step "FAILED: $*"; "$K" delete ns "$NS" --wait=false >/dev/null 2>&1 || true; exit 1; }
# Polls a command until its output equals <want>, for up to <secs> seconds.
expect() { # <secs> <want> <cmd...>
  local secs=$1 want=$2 got="" deadline
  shift 2
  deadline=$((SECONDS + secs))
  while [ $SECONDS -lt $deadline ]; do
    got=$("$@" 2>&1) || true
    [ "$got" = "$want" ] && return 0
    sleep 0.5
  done
  die "expected '$want' from '$*', got '$got'"
}

[ -s "$KUBECONFIG" ] || die "no kubeconfig at $KUBECONFIG (run make cluster-up)"
expect 10 ok "$K" get --raw /readyz
step "readyz ok"

ready_nodes() { "$K" get nodes -l type=kwok --no-headers | awk '$2 == "Ready"' | wc -l | tr -d ' '; }
expect 30 "$N" ready_nodes
step "$N fake nodes Ready"

"$K" create ns "$NS" >/dev/null
"$K" -n "$NS" create deployment web --image=registry.invalid/pause --replicas=2 >/dev/null
running_ready() {
  "$K" -n "$NS" get pods -l app=web -o \
    jsonpath='{range .items[*]}{.status.phase}/{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' |
    grep -c '^Running/True$' || true
}
expect 60 2 running_ready
step "Deployment: 2 Pods Running and Ready"

"$K" -n "$NS" delete deployment web --wait=false >/dev/null
leftovers() { "$K" -n "$NS" get rs,pods -l app=web --no-headers 2>/dev/null | wc -l | tr -d ' '; }
expect 60 0 leftovers
step "Deployment deleted: ReplicaSet and Pods garbage-collected"

"$K" -n "$NS" create job done --image=registry.invalid/true >/dev/null
expect 60 True "$K" -n "$NS" get job done -o 'jsonpath={.status.conditions[?(@.type=="Complete")].status}'
step "Job complete"

"$K" -n "$NS" apply -f - >/dev/null <<'EOF'
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec:
  serviceName: db
  replicas: 2
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      containers: [{name: db, image: registry.invalid/db, volumeMounts: [{name: data, mountPath: /data}]}]
  volumeClaimTemplates:
  - metadata: {name: data}
    spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
EOF
expect 60 2 "$K" -n "$NS" get statefulset db -o 'jsonpath={.status.readyReplicas}'
expect 10 "Bound Bound" "$K" -n "$NS" get pvc -o 'jsonpath={.items[*].status.phase}'
step "StatefulSet: 2 claims provisioned (default StorageClass, host-path) and 2 Pods Ready"

"$K" delete ns "$NS" --wait=false >/dev/null
ns_gone() { "$K" get ns "$NS" --no-headers 2>/dev/null | wc -l | tr -d ' '; }
expect 60 0 ns_gone
step "Namespace deleted"
step "all checks passed"
