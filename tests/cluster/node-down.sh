#!/usr/bin/env bash
# Stops the real node that node-up.sh added and undoes what it did to the machine (down.sh runs it
# first): the node's Pods' containers and shims, kubelet, kube-proxy, CoreDNS, the registry,
# containerd; the mounts under the node's directory and /run/netns; the cgroups the kubelet and
# containerd made (kubepods, k8s.io) in every v1 hierarchy; the CNI bridge and its veths; the iptables
# chains of kube-proxy and of the CNI plugins; /run/containerd, the node's CNI results and the
# kubelet's device-plugins directory; the Node object if the API server still answers. Safe to run when no node
# is up.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BIN=$HERE/bin
CL=$ROOT/.cluster
PIDS=$CL/pids
NODE=$CL/node
NODE_NAME=metahook-real-node
GRACE=${DOWN_GRACE:-5}

log() { printf '[node-down] %s\n' "$*" >&2; }

if [ "${CLUSTER_LOCK_HELD:-0}" != 1 ]; then
  mkdir -p "$BIN"
  exec 9>"$BIN/.cluster.lock"
  flock -w 600 9 || { log "another up.sh/down.sh holds $BIN/.cluster.lock"; exit 1; }
fi
# Everything below is ours only if node-up.sh made the node directory (it refuses to start beside
# another containerd), so without it nothing is touched.
[ -d "$NODE" ] || { log "no node"; exit 0; }

ours() { kill -0 "$1" 2>/dev/null && [[ "$(readlink "/proc/$1/exe" 2>/dev/null || true)" == "$BIN/"* ]]; }
stop() { # <name>: TERM, then KILL after GRACE seconds
  local f=$PIDS/$1.pid pid deadline
  [ -s "$f" ] || return 0
  pid=$(cat "$f")
  ours "$pid" || { rm -f "$f"; return 0; }
  log "stopping $1 (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  deadline=$((SECONDS + GRACE))
  while ours "$pid" && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
  ours "$pid" && kill -KILL "$pid" 2>/dev/null || true
  rm -f "$f"
}

# The kubelet first (it would restart what we stop), then the Pods' processes: every shim and what
# runs under it (containers, pause), found by the shim's binary. containerd last.
stop kubelet
stop kube-proxy
stop coredns
stop registry
shims=()
for p in /proc/[0-9]*; do
  [ "$(readlink "$p/exe" 2>/dev/null || true)" = "$BIN/containerd-shim-runc-v2" ] && shims+=("${p#/proc/}")
done
if [ ${#shims[@]} -gt 0 ]; then
  # The containers are the shims' children (and theirs): kill the whole trees.
  victims=()
  for s in "${shims[@]}"; do
    victims+=("$s")
    mapfile -t kids < <(ps -o pid= --ppid "$s" 2>/dev/null || true)
    for k in "${kids[@]}"; do
      victims+=("$k")
      mapfile -t more < <(pgrep -P "$k" 2>/dev/null || true)
      victims+=("${more[@]}")
    done
  done
  log "killing ${#shims[@]} shims and their containers"
  kill -KILL "${victims[@]}" 2>/dev/null || true
  sleep 0.5
fi
stop containerd

# Mounts: the kubelet's volumes and the containers' root filesystems under the node's directory,
# network namespaces under /run/netns and the runtime's state under /run/containerd. Deepest first.
mapfile -t mounts < <(awk '{ print $2 }' /proc/self/mounts | grep -E "^($NODE|/run/netns/cni-|/run/containerd)/?" | sort -r)
for m in "${mounts[@]}"; do umount -l "$m" 2>/dev/null || true; done
[ ${#mounts[@]} -eq 0 ] || log "unmounted ${#mounts[@]} mounts"
rm -rf /run/containerd /var/lib/cni/results/metahook-node-* /var/lib/kubelet/device-plugins
rmdir /var/lib/cni/results /var/lib/cni /var/lib/kubelet 2>/dev/null || true
rm -f /run/netns/cni-* 2>/dev/null || true

# cgroups (v1: one tree per controller; v2: one): children before parents.
for root in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
  for top in kubepods k8s.io; do
    [ -d "$root$top" ] || continue
    find "$root$top" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
done

# The bridge (its veths go with their namespaces), kube-proxy's chains, the CNI plugins' chains, our
# guard of the Service addresses (node-up.sh).
ip link del mh-cni0 2>/dev/null || true
if [ -x "$BIN/kube-proxy" ]; then "$BIN/kube-proxy" --cleanup >/dev/null 2>&1 || true; fi
for table in nat filter mangle; do
  iptables -t "$table" -S 2>/dev/null | awk '$1 == "-A" && /CNI-|KUBE-|metahook-real-node/' | sed 's/^-A/-D/' |
    while read -r rule; do eval "iptables -t $table $rule" 2>/dev/null || true; done
  iptables -t "$table" -S 2>/dev/null | awk '$1 == "-N" && ($2 ~ /^(CNI-|KUBE-)/) { print $2 }' |
    while read -r chain; do iptables -t "$table" -F "$chain" 2>/dev/null || true; done
  iptables -t "$table" -S 2>/dev/null | awk '$1 == "-N" && ($2 ~ /^(CNI-|KUBE-)/) { print $2 }' |
    while read -r chain; do iptables -t "$table" -X "$chain" 2>/dev/null || true; done
done

# The Node object, so a cluster that keeps running does not keep a NotReady node.
if [ -s "$CL/admin.kubeconfig" ] && [ -x "$BIN/kubectl" ]; then
  "$BIN/kubectl" --kubeconfig "$CL/admin.kubeconfig" --request-timeout=5s delete node "$NODE_NAME" \
    --ignore-not-found >/dev/null 2>&1 || true
fi
rm -rf "$NODE"
log "node down"
