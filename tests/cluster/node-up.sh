#!/usr/bin/env bash
# Adds one real node to the running local control plane (up.sh), beside the fake kwok nodes:
#   containerd 2.x (+ its runc shim, Debian's runc) -> kubelet -> kube-proxy (iptables) + CoreDNS
# so that Pods really run: the hub installed from its chart, hooks as Deployments behind Services,
# `service:` hook references and every other cluster.local name resolving as in any cluster.
# Images are never pulled from the internet: they are built here (deploy/image/node-images.sh: pause,
# busybox, the Python and Node hook runtimes) and imported into containerd; a local registry serves the
# same images as a mirror of docker.io, registry.k8s.io and ghcr.io for Pods that pull `Always`.
#
# The node is named metahook-real-node, labelled metahook.dev/real-node=true and tainted
# metahook.dev/real-node=true:NoSchedule, so only Pods that ask for it (the real-node tests) land on it:
# other tests' Pods, whose images are not here, stay on the fake nodes.
#
# Needs root (mounts, network namespaces, cgroups, iptables). Installs Debian's runc, iptables and
# containernetworking-plugins with apt-get when missing. State lives in <repo>/.cluster/node/ (and, fixed
# by runc and the kubelet's plugins, /run/containerd, /var/lib/kubelet/device-plugins, /var/lib/cni);
# node-down.sh (which down.sh runs) undoes all of it. Idempotent: a healthy node is reused.
# Progress goes to stderr; stdout gets one line, the node's name.
#
# Env: CLUSTER_TIMEOUT (seconds per wait, default 120).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BIN=$HERE/bin
CL=$ROOT/.cluster
PKI=$CL/pki
LOGS=$CL/logs
PIDS=$CL/pids
NODE=$CL/node
TIMEOUT=${CLUSTER_TIMEOUT:-120}
ADMIN_KC=$CL/admin.kubeconfig
NODE_COMPONENTS=(containerd registry kubelet kube-proxy coredns)

NODE_NAME=metahook-real-node
POD_CIDR=10.245.0.0/24  # the real node's Pods (kwok's fake Pods use 10.244.0.0/16)
SVC_CIDR=10.96.0.0/16   # Service addresses, as up.sh gives the API server
CLUSTER_DNS=10.96.0.10  # the kube-dns Service, in SVC_CIDR
DNS_PORT=1053           # where CoreDNS listens on the node's address (the Service maps 53 to it)
PAUSE_IMAGE=registry.k8s.io/pause:3.10
SOCK=$NODE/containerd.sock

log() { printf '[node-up] %s\n' "$*" >&2; }
fail() { # <component> <message>
  log "FAILED: $1: $2"
  if [ -f "$LOGS/$1.log" ]; then
    log "last 30 lines of $LOGS/$1.log:"
    tail -n 30 "$LOGS/$1.log" >&2 || true
  fi
  log "stopping the node (the control plane keeps running)"
  CLUSTER_LOCK_HELD=1 bash "$HERE/node-down.sh" >&2 || true
  exit 1
}
# shellcheck source=tests/cluster/lib.sh
source "$HERE/lib.sh"

[ "$(id -u)" = 0 ] || { log "FAILED: a real node needs root (mounts, network namespaces, cgroups)"; exit 1; }

# The control plane first (reused when it runs), then its lock, which node-down.sh and down.sh share.
bash "$HERE/up.sh" >/dev/null || { log "FAILED: tests/cluster/up.sh"; exit 1; }
exec 9>"$BIN/.cluster.lock"
flock -w 600 9 || { log "FAILED: another up.sh/down.sh/node-up.sh holds $BIN/.cluster.lock"; exit 1; }
export CLUSTER_LOCK_HELD=1
API_PORT=$(sed -n 's/^CLUSTER_API_PORT=//p' "$CL/env")
NODE_IP=$(node_ip)
[ -n "$NODE_IP" ] || { log "FAILED: this machine has no IPv4 default route, so no address for the node"; exit 1; }

kubectl() { "$BIN/kubectl" --kubeconfig "$ADMIN_KC" "$@"; }
node_ready() {
  [ "$(kubectl get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

# DNAT comes first (nat PREROUTING/OUTPUT), so only Service addresses kube-proxy left alone reach these
# rules (why they exist: below, where a new node gets them).
guard_service_addresses() {
  local rule=(-d "$SVC_CIDR" -m comment --comment "metahook-real-node: unrouted Service address" -j REJECT)
  for chain in FORWARD OUTPUT; do
    iptables -C "$chain" "${rule[@]}" 2>/dev/null || iptables -I "$chain" 1 "${rule[@]}" ||
      { log "FAILED: iptables -I $chain ${rule[*]}"; exit 1; }
  done
}

all_alive=1
for c in "${NODE_COMPONENTS[@]}"; do alive_pid "$c" >/dev/null || { all_alive=0; break; }; done
if [ $all_alive = 1 ] && node_ready; then
  log "reusing running node $NODE_NAME"
  guard_service_addresses
  echo "$NODE_NAME"
  exit 0
fi
if [ -d "$NODE" ]; then
  log "found a stale or half-started node in $NODE; tearing it down"
  bash "$HERE/node-down.sh" >&2
fi
# runc and the shims keep their state under /run/containerd whatever containerd's own paths are, so
# another containerd on this machine would share it (and node-down.sh would remove it).
[ ! -e /run/containerd ] ||
  { log "FAILED: /run/containerd exists: another containerd runs here; the test node needs it to itself"; exit 1; }
trap 'fail "${CURRENT:-node-up.sh}" "interrupted"' INT TERM
t0=$SECONDS

# ---- what the node is made of ------------------------------------------------------------------
# Debian's runc, iptables and CNI plugins; everything else is built from Go modules.
CNI_BIN=/usr/lib/cni
if ! command -v runc >/dev/null || ! command -v iptables >/dev/null || [ ! -x "$CNI_BIN/bridge" ]; then
  log "installing Debian's runc, iptables and containernetworking-plugins"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q runc iptables containernetworking-plugins >&2 ||
    { log "FAILED: apt-get install runc iptables containernetworking-plugins"; exit 1; }
fi
bash "$HERE/node-build.sh" || { log "FAILED: tests/cluster/node-build.sh"; exit 1; }
IMAGES=$ROOT/target/node-images
bash "$ROOT/deploy/image/node-images.sh" "$IMAGES" || { log "FAILED: deploy/image/node-images.sh"; exit 1; }
tbuilt=$SECONDS

# The kernel side: forwarding for the Pods' bridge, and bridged traffic through iptables so a Pod reaches
# a Service whose endpoint is on the same bridge (kube-proxy's rules). br_netfilter may be built in.
modprobe br_netfilter 2>/dev/null || true
modprobe overlay 2>/dev/null || true
[ -e /proc/sys/net/bridge/bridge-nf-call-iptables ] ||
  { log "FAILED: no br_netfilter (/proc/sys/net/bridge): Services cannot reach Pods on the node's bridge"; exit 1; }
sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1

# A Service address that kube-proxy has not rewritten (a Service created a moment ago, or between two
# of its rule updates) leads nowhere, as in any cluster, where those addresses are virtual: refused at
# once. Without this, the packet follows this machine's default route, where the sandbox's network
# answers any TCP connection (HTTP 404, empty body, kept alive on port 8080): a hub calling a hook
# Service created moments before kept that stranger's connection in its pool and got 404 for minutes.
# (guard_service_addresses, above: a reused node gets it too.)
guard_service_addresses

mkdir -p "$NODE"/{containerd/root,containerd/state,certs.d,cni/net.d,cni/ipam,kubelet,pod-logs} "$LOGS" "$PIDS"

# ---- containerd --------------------------------------------------------------------------------
# restrict_oom_score_adj: this machine grants no CAP_SYS_RESOURCE, and runc fails every sandbox when
# it may not lower oom_score_adj. SystemdCgroup=false: cgroup v1 with the cgroupfs driver (the kubelet
# says the same). The sandbox image is pinned to the locally built pause so it is never pulled.
# config_path: hosts.toml files naming the local registry as the mirror of each registry we serve.
cat >"$NODE/containerd.toml" <<EOF
version = 3
root = "$NODE/containerd/root"
state = "$NODE/containerd/state"
imports = []

[grpc]
  address = "$SOCK"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$PAUSE_IMAGE"
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "$NODE/certs.d"

[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["$CNI_BIN"]
    conf_dir = "$NODE/cni/net.d"
EOF
# The runc shim must be on containerd's PATH.
PATH=$BIN:$PATH start containerd "$BIN/containerd" --config "$NODE/containerd.toml" --log-level warn
ctr() { "$BIN/ctr" --address "$SOCK" --namespace k8s.io "$@"; }
ctr_answers() { ctr version >/dev/null 2>&1; }
wait_for containerd "containerd's socket $SOCK" ctr_answers
for archive in "$IMAGES"/*.tar; do
  ctr images import "$archive" >/dev/null 2>>"$LOGS/containerd.log" ||
    fail containerd "ctr images import $archive"
done
log "imported $(find "$IMAGES" -maxdepth 1 -name '*.tar' | wc -l) images: $(ctr images ls -q 2>/dev/null | grep -v '^sha256:' | tr '\n' ' ')"

# The local registry, as the mirror of the registries our images name (for Pods that pull Always).
REGISTRY_PORT=$(free_port)
images=()
for archive in "$IMAGES"/*.tar; do images+=(-image "$archive"); done
start registry "$BIN/registry" -addr "127.0.0.1:$REGISTRY_PORT" "${images[@]}"
registry_ready() { curl -sf --max-time 2 "http://127.0.0.1:$REGISTRY_PORT/v2/" >/dev/null; }
wait_for registry "the local registry on port $REGISTRY_PORT" registry_ready
for host in docker.io registry.k8s.io ghcr.io metahook.local; do
  mkdir -p "$NODE/certs.d/$host"
  cat >"$NODE/certs.d/$host/hosts.toml" <<EOF
server = "https://$host"

[host."http://127.0.0.1:$REGISTRY_PORT"]
  capabilities = ["pull", "resolve"]
EOF
done

# ---- CNI: one bridge, addresses from the node's Pod range ----------------------------------------
cat >"$NODE/cni/net.d/10-metahook.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "metahook-node",
  "plugins": [
    {
      "type": "bridge", "bridge": "mh-cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
      "ipam": {"type": "host-local", "dataDir": "$NODE/cni/ipam", "ranges": [[{"subnet": "$POD_CIDR"}]],
               "routes": [{"dst": "0.0.0.0/0"}]}
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF

# ---- kubelet -----------------------------------------------------------------------------------
# failCgroupV1: false — kubelet >= 1.35 refuses cgroup v1 otherwise, and this machine has only v1.
# makeIPTablesUtilChains: false — its KUBE-FIREWALL chain drops traffic to 127.0.0.0/8 from anything
# but loopback, where the whole control plane listens. Anonymous + AlwaysAllow: the API server reaches
# it for `kubectl logs` without a client certificate (a local test node only). Evictions only when the
# machine is really out of room: the tests run beside builds that fill the disk for a while.
KUBELET_PORT=$(free_port)
KUBELET_HEALTHZ_PORT=$(free_port)
cat >"$NODE/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
makeIPTablesUtilChains: false
containerRuntimeEndpoint: unix://$SOCK
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
clusterDomain: cluster.local
clusterDNS: [$CLUSTER_DNS]
podCIDR: $POD_CIDR
podLogsDir: $NODE/pod-logs
failSwapOn: false
serializeImagePulls: false
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
registerWithTaints:
- {key: metahook.dev/real-node, value: "true", effect: NoSchedule}
EOF
start kubelet "$BIN/kubelet" --config="$NODE/kubelet.yaml" --kubeconfig="$ADMIN_KC" \
  --root-dir="$NODE/kubelet" --cert-dir="$NODE/kubelet/pki" \
  --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" --node-labels=metahook.dev/real-node=true
wait_for kubelet "node $NODE_NAME Ready" node_ready
tready=$SECONDS

# ---- the cluster's Services: `kubernetes` and kube-dns --------------------------------------------
# up.sh runs the API server with --endpoint-reconciler-type=none (its loopback advertise address can
# be no endpoint), so the `kubernetes` Service's EndpointSlice is written here: the machine's address.
kubectl apply --server-side --field-manager=metahook-node-up -f - >/dev/null <<EOF || fail kube-apiserver "the kubernetes and kube-dns Services"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kubernetes
  namespace: default
  labels: {kubernetes.io/service-name: kubernetes, endpointslice.kubernetes.io/managed-by: metahook-node-up}
addressType: IPv4
endpoints: [{addresses: ["$NODE_IP"], conditions: {ready: true}}]
ports: [{name: https, port: $API_PORT, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {k8s-app: kube-dns, kubernetes.io/name: CoreDNS}
spec:
  clusterIP: $CLUSTER_DNS
  ports:
  - {name: dns, port: 53, protocol: UDP, targetPort: $DNS_PORT}
  - {name: dns-tcp, port: 53, protocol: TCP, targetPort: $DNS_PORT}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kube-dns-node
  namespace: kube-system
  labels: {kubernetes.io/service-name: kube-dns, endpointslice.kubernetes.io/managed-by: metahook-node-up}
addressType: IPv4
endpoints: [{addresses: ["$NODE_IP"], conditions: {ready: true}}]
ports:
- {name: dns, port: $DNS_PORT, protocol: UDP}
- {name: dns-tcp, port: $DNS_PORT, protocol: TCP}
EOF

# ---- kube-proxy ----------------------------------------------------------------------------------
# localhostNodePorts: false — otherwise it adds a rule dropping non-loopback traffic to 127.0.0.0/8
# (as the kubelet's KUBE-FIREWALL would). conntrack: 0 leaves the kernel's settings alone (this machine
# may not change them).
cat >"$NODE/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $ADMIN_KC}
mode: iptables
hostnameOverride: $NODE_NAME
clusterCIDR: $POD_CIDR
healthzBindAddress: 127.0.0.1:$(free_port)
metricsBindAddress: 127.0.0.1:$(free_port)
iptables: {localhostNodePorts: false}
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
start kube-proxy "$BIN/kube-proxy" --config="$NODE/kube-proxy.yaml"
proxy_synced() { iptables -t nat -S KUBE-SERVICES 2>/dev/null | grep -q "default/kubernetes:https"; }
wait_for kube-proxy "kube-proxy's rules for the kubernetes Service" proxy_synced

# ---- CoreDNS, the kube-dns Service's endpoint ----------------------------------------------------
# A process beside the kubelet, as the control plane's components are here; the Service and the Pods'
# resolv.conf (clusterDNS) are as in any cluster.
COREDNS_READY_PORT=$(free_port)
cat >"$NODE/Corefile" <<EOF
.:$DNS_PORT {
  bind $NODE_IP
  errors
  ready 127.0.0.1:$COREDNS_READY_PORT
  kubernetes cluster.local in-addr.arpa ip6.arpa {
    kubeconfig $ADMIN_KC metahook-testenv
    pods insecure
    fallthrough in-addr.arpa ip6.arpa
  }
  forward . /etc/resolv.conf
  cache 5
  loadbalance
}
EOF
start coredns "$BIN/coredns" -conf "$NODE/Corefile"
coredns_ready() { curl -sf --max-time 2 "http://127.0.0.1:$COREDNS_READY_PORT/ready" >/dev/null; }
wait_for coredns "CoreDNS ready (its Kubernetes caches synced)" coredns_ready

cat >"$NODE/env" <<EOF
NODE_NAME=$NODE_NAME
NODE_IP=$NODE_IP
NODE_CONTAINERD_SOCK=$SOCK
NODE_REGISTRY=127.0.0.1:$REGISTRY_PORT
NODE_CLUSTER_DNS=$CLUSTER_DNS
NODE_POD_LOGS=$NODE/pod-logs
EOF
log "node $NODE_NAME ($NODE_IP) ready: built/checked in $((tbuilt - t0)) s, Ready $((tready - tbuilt)) s after that, all up in $((SECONDS - t0)) s"
echo "$NODE_NAME"
