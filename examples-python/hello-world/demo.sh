#!/usr/bin/env bash
# `make demo`: the hello-world controller end to end on the local control plane.
# Starts (or reuses) the cluster, the Python hook and the hub; creates a HelloWorld; shows what the hub did.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
here="$root/examples-python/hello-world"
cd "$root"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "control plane (first run builds Kubernetes from Go modules: ~10-20 min on 2 cores)"
export KUBECONFIG=$(bash tests/cluster/up.sh | tail -n 1)
kubectl() { "$root/tests/cluster/bin/kubectl" "$@"; }

step "building metahook"
cargo build --quiet --bin metahook

logs="$root/.cluster/logs"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
PORT=$port python3 "$here/hook.py" >"$logs/demo-hook.log" 2>&1 &
hook_pid=$!
./target/debug/metahook run >"$logs/demo-hub.log" 2>&1 &
hub_pid=$!
trap 'kill $hub_pid $hook_pid 2>/dev/null || true' EXIT

step "installing the CRDs and the hello-world CompositeController (hook on 127.0.0.1:$port)"
kubectl apply -f crds/ -f "$here/crd.yaml"
kubectl wait --for condition=established --timeout=60s crd/helloworlds.example.metahook.dev >/dev/null
sed "s#http://127.0.0.1:18080#http://127.0.0.1:$port#" "$here/controller.yaml" | kubectl apply -f -
kubectl delete helloworld world --ignore-not-found --wait >/dev/null

step "creating a HelloWorld with 2 replicas"
kubectl apply -f "$here/hello.yaml"
for _ in $(seq 1 90); do
  ready=$(kubectl get helloworld world -o jsonpath='{.status.readyPods}' 2>/dev/null || true)
  [ "$ready" = "2" ] && break
  sleep 1
done
if [ "${ready:-}" != "2" ]; then
  echo "the HelloWorld did not get 2 Ready Pods in 90s; hub log:" >&2
  tail -n 30 "$logs/demo-hub.log" >&2
  exit 1
fi

step "the controller"
kubectl get compositecontroller hello-world
step "the parent and the Pods the hub created for it"
kubectl get helloworld world
kubectl get pods -l app=hello-world -o wide
step "the parent's status, written from the hook's answer"
kubectl get helloworld world -o jsonpath='{.status}' | python3 -m json.tool
step "what a Pod will say"
kubectl get pod world-0 -o jsonpath='{.spec.containers[0].command}'; echo

printf '\nThe control plane is still running (KUBECONFIG=%s); `make cluster-down` stops it.\n' "$KUBECONFIG"
