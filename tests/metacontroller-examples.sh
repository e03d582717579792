#!/usr/bin/env bash
# Metacontroller's own examples, each run by its own, unchanged test.sh (install with `kubectl apply
# -k`, test, tear down with `kubectl delete -k` in its EXIT trap), against the hub installed from its
# Helm chart as Metacontroller is installed: one replica in the cluster, rights like Metacontroller's
# (rbac.mode=cluster-admin-like), the hooks as Deployments in the `metacontroller` namespace, called
# by their Service names. Everything that runs in a Pod runs on the real node (tests/cluster/node-up.sh),
# on images built here (deploy/image/node-images.sh with MC_EXAMPLES). The examples' workloads in the
# `default` namespace (nginx StatefulSets, busybox DaemonSets) go to the fake nodes, whose Pods become
# Ready without running, except indexedjob's: its test reads what its busybox Pods print, so for it
# `default` sends Pods to the real node.
#
#   MC_SRC=<a clone of github.com/metacontroller/metacontroller> tests/metacontroller-examples.sh [EXAMPLE...]
#
# For each example: PASSED or FAILED, its whole time, and how long its teardown took (from test.sh's
# "Clean up..." to its exit); then that nothing the hub keeps is left that was not there before the
# example: no controller, no hub finalizer, no ChildRecord. The hub serves every controller of the
# cluster while it runs (as Metacontroller would): it is uninstalled when the script exits, so run
# nothing else on the cluster meanwhile. The examples that test Metacontroller's own
# StatefulSet (leader-election, pprof-profiling, prometheus-monitoring, target-label-selector) are not
# run: the hub is installed differently (docs/src/switching.md). Nor are the two service-per-pod
# examples: their hook image (metacontroller/jsonnetd) has no source to build here.
# Exit status: the number of failed examples (0: all passed). Logs: target/mc-examples/<example>.log.
# Needs root (the real node). Env: EXAMPLE_TIMEOUT (seconds, default 300, as Metacontroller's runner).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
BIN=$ROOT/tests/cluster/bin
OUT=$ROOT/target/mc-examples
TIMEOUT=${EXAMPLE_TIMEOUT:-300}
log() { printf '[mc-examples] %s\n' "$*" >&2; }
die() {
  log "ERROR: $*"
  exit 100
}

[ -n "${MC_SRC:-}" ] || die "MC_SRC=<a clone of github.com/metacontroller/metacontroller> is required"
EXAMPLES_DIR=$(cd "$MC_SRC/examples" && pwd) || die "$MC_SRC has no examples/"
[ "$(id -u)" = 0 ] || die "the real node needs root"
DEFAULT=(bluegreen catset clusteredparent configmap-list-v2 configmappropagation crd-roles daemonjob
  globalconfigmap indexedjob namespace-list-v2 secretpropagation update-strategy webhook-auth)
if [ $# -gt 0 ]; then EXAMPLES=("$@"); else EXAMPLES=("${DEFAULT[@]}"); fi
mkdir -p "$OUT"

KUBECONFIG=$(bash "$ROOT/tests/cluster/up.sh" | tail -n 1)
export KUBECONFIG
export PATH=$BIN:$PATH
bash "$ROOT/tests/cluster/node-up.sh" >/dev/null
# shellcheck disable=SC1091
. "$ROOT/.cluster/node/env"
ctr() { "$BIN/ctr" --address "$NODE_CONTAINERD_SOCK" --namespace k8s.io "$@"; }

# ---- images: the examples' stand-ins and the hub's, in containerd and in the node's registry --------
MC_EXAMPLES=$EXAMPLES_DIR bash "$ROOT/deploy/image/node-images.sh" "$ROOT/target/mc-images"
log "building the hub (dev profile) and its image"
(cd "$ROOT" && cargo build --locked --bin metahook)
TAG=mc-examples
IMAGE=ghcr.io/metahook/metahook:$TAG IMAGE_QUIET=1 bash "$ROOT/deploy/image/build.sh" \
  "$ROOT/target/debug/metahook" "$OUT/metahook.tar" >/dev/null
pushes=()
for archive in "$ROOT"/target/mc-images/*.tar "$OUT/metahook.tar"; do
  ctr images import "$archive" >/dev/null
  pushes+=(-image "$archive")
done
"$BIN/registry" -push-to "$NODE_REGISTRY" "${pushes[@]}" 2>&1 | sed 's/^/  /' >&2

# ---- the hub, as Metacontroller is installed ---------------------------------------------------------
real_node_namespace() {
  kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Namespace
metadata:
  name: $1
  annotations:
    scheduler.alpha.kubernetes.io/node-selector: metahook.dev/real-node=true
    scheduler.alpha.kubernetes.io/defaultTolerations: '[{"key":"metahook.dev/real-node","operator":"Exists","effect":"NoSchedule"}]'
EOF
}
real_node_namespace metahook-system
real_node_namespace metacontroller
bash "$ROOT/deploy/helm/tools/build.sh" >/dev/null
trap '"$BIN/helm" uninstall metahook -n metahook-system --wait >/dev/null 2>&1 || true' EXIT
log "helm install metahook (one replica, rbac.mode=cluster-admin-like)"
"$BIN/helm" upgrade --install metahook "$ROOT/deploy/helm/metahook" -n metahook-system --wait --timeout 180s \
  --set replicas=1 --set image.tag=$TAG --set image.pullPolicy=IfNotPresent --set rbac.mode=cluster-admin-like >/dev/null
kubectl -n metahook-system rollout restart deployment/metahook >/dev/null # the image of this build
kubectl -n metahook-system rollout status deployment/metahook --timeout=180s >/dev/null
HUB_POD=$(kubectl -n metahook-system get pods -l app.kubernetes.io/instance=metahook --sort-by=.metadata.creationTimestamp -o name | tail -n 1)
log "hub running: $HUB_POD"

# ---- the examples --------------------------------------------------------------------------------------
# stamp: each line of stdin with the seconds since $1.
stamp() { while IFS= read -r line; do printf '%6.1f %s\n' "$(awk -v now="$(date +%s.%N)" -v t0="$1" 'BEGIN { print now - t0 }')" "$line"; done; }
# kept: what the hub keeps (controllers, objects with its finalizers, records), one per line.
kept() {
  {
    kubectl get compositecontrollers,decoratorcontrollers,mapcontrollers -o name 2>/dev/null
    kubectl get crd -o name | while read -r crd; do
      kubectl get "${crd#*/}" -A -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name} {.metadata.finalizers}{"\n"}{end}' 2>/dev/null |
        awk -v type="${crd#*/}" '$2 ~ /metacontroller|metahook/ { print "finalized " type " " $0 }'
    done
    kubectl get childrecords.metahook.dev -A -o name 2>/dev/null
  } | LC_ALL=C sort
}
failed=0
summary=()
NODE_ANNOTATIONS=(scheduler.alpha.kubernetes.io/node-selector scheduler.alpha.kubernetes.io/defaultTolerations)
for example in "${EXAMPLES[@]}"; do
  [ -x "$EXAMPLES_DIR/$example/test.sh" ] || die "no $EXAMPLES_DIR/$example/test.sh"
  if [ "$example" = indexedjob ]; then
    real_node_namespace default
  else
    kubectl annotate namespace default "${NODE_ANNOTATIONS[@]/%/-}" >/dev/null 2>&1 || true
  fi
  before=$(kept)
  start=$(date +%s.%N)
  status=0
  (cd "$EXAMPLES_DIR/$example" && timeout --signal=SIGTERM "$TIMEOUT" ./test.sh v1) 2>&1 | stamp "$start" >"$OUT/$example.log" ||
    status=$?
  total=$(awk 'END { print $1 }' "$OUT/$example.log")
  cleanup_at=$(awk '/Clean up|Cleaning up/ { print $1; exit }' "$OUT/$example.log")
  teardown=$(if [ -n "$cleanup_at" ]; then awk -v a="$total" -v b="$cleanup_at" 'BEGIN { printf "%.1f", a - b }'; else echo "?"; fi)
  left=$(LC_ALL=C comm -13 <(echo "$before") <(kept) | tr '\n' ';')
  if [ "$status" = 0 ] && [ -z "$left" ]; then
    result=PASSED
  else
    result="FAILED (exit $status)${left:+ left: $left}"
    failed=$((failed + 1))
    tail -n 30 "$OUT/$example.log" | sed 's/^/    /' >&2
  fi
  line=$(printf '%-22s %s  total %5.1f s, teardown %s s' "$example" "$result" "$total" "$teardown")
  log "$line"
  summary+=("$line")
done
kubectl annotate namespace default "${NODE_ANNOTATIONS[@]/%/-}" >/dev/null 2>&1 || true
kubectl -n metahook-system logs "$HUB_POD" >"$OUT/hub.log" 2>&1 || true
log "hub log: $OUT/hub.log"
printf '%s\n' "${summary[@]}"
log "$(( ${#EXAMPLES[@]} - failed ))/${#EXAMPLES[@]} examples passed"
exit "$failed"
