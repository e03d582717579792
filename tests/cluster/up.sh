#!/usr/bin/env bash
# Starts (or reuses) the local control plane that integration tests run against:
#   etcd -> kube-apiserver (+ default StorageClass) -> kube-controller-manager (with the host-path
#   provisioner) + kube-scheduler -> kwok (fake nodes)
# Everything listens on 127.0.0.1, on ports picked at start. State lives in <repo>/.cluster/:
#   kubeconfig  admin kubeconfig (system:masters, embedded certs)      <- what tests use
#   env         shell-sourceable KUBECONFIG / ports / paths
#   pki/ logs/<name>.log pids/<name>.pid etcd/
# Progress goes to stderr; stdout gets exactly one line, the kubeconfig path, so
#   export KUBECONFIG=$(bash tests/cluster/up.sh)
# works. Idempotent: a healthy running cluster is reused (and brought up to date in place if an older
# up.sh started it); a half-dead one is torn down first.
#
# Env: FAKE_NODES (default 2), CLUSTER_TIMEOUT (seconds per wait, default 120),
#      CLUSTER_FIXED_API_PORT (use this apiserver port instead of a free one),
#      CLUSTER_DIR (state directory instead of <repo>/.cluster: a second cluster beside the shared one,
#      e.g. tests/standalone.rs's, which must have no controller CRDs; down.sh takes it too).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BIN=$HERE/bin
CL=${CLUSTER_DIR:-$ROOT/.cluster}
PKI=$CL/pki
LOGS=$CL/logs
PIDS=$CL/pids
KUBECONFIG_OUT=$CL/kubeconfig
FAKE_NODES=${FAKE_NODES:-2}
TIMEOUT=${CLUSTER_TIMEOUT:-120}
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)

log() { printf '[cluster-up] %s\n' "$*" >&2; }

# ---------------------------------------------------------------------------------------------
# Helpers

fail() { # <component> <message>
  log "FAILED: $1: $2"
  if [ -f "$LOGS/$1.log" ]; then
    log "last 30 lines of $LOGS/$1.log:"
    tail -n 30 "$LOGS/$1.log" >&2 || true
  fi
  log "stopping everything that was started"
  bash "$HERE/down.sh" --keep-logs >&2 || true
  log "logs kept in $LOGS"
  exit 1
}

# alive_pid, api, readyz, wait_for, start, free_port
# shellcheck source=tests/cluster/lib.sh
source "$HERE/lib.sh"

SVC_CIDR=10.96.0.0/16
API_SERVICE_IP=10.96.0.1 # the `kubernetes` Service: the first address of SVC_CIDR
NODE_IP=$(node_ip)
ADMIN_KC=$CL/admin.kubeconfig

# sign <name> <subject> <extensions>: a key and a certificate signed by the cluster CA (run in $PKI).
sign() { # <name> <subject> <extensions>
  openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2"
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -out "$1.crt" \
    -extfile <(printf '%b' "$3")
  rm -f "$1.csr"
}
# The API server's serving certificate. Its names cover every way it is reached: loopback (tests,
# components), the `kubernetes` Service (Pods) and the machine's address (the real node).
sign_apiserver() {
  sign apiserver /CN=kube-apiserver \
    "subjectAltName=IP:127.0.0.1,IP:$API_SERVICE_IP${NODE_IP:+,IP:$NODE_IP},DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE"
}

# kube-controller-manager, with the same flags on a fresh start and when an old cluster is upgraded.
# --enable-hostpath-provisioner: the PersistentVolume controller provisions claims of StorageClasses
# with provisioner kubernetes.io/host-path itself (a directory /tmp/hostpath_pv/<uuid>, made by
# KCM, no Pod involved), so StatefulSet-style volumeClaimTemplates bind. Test clusters only.
# --feature-gates=StaleControllerConsistency*=false: 1.36's beta check makes the ReplicaSet, StatefulSet,
# DaemonSet and Job controllers refuse to sync until their cache has seen their own last write, and
# requeue the object with per-object exponential backoff meanwhile (pkg/controller/util/consistency).
# On this busy 2-core test cluster such refusals pile up for objects that a test's controller writes
# often (seen: a ReplicaSet refused four times in one run), and a fresh-clone run once waited 60 s
# for a ReplicaSet's status. That is the ReplicaSet controller's own pacing, which no hub test is about.
KCM_FEATURE_GATES=StaleControllerConsistencyDaemonSet=false,StaleControllerConsistencyJob=false,StaleControllerConsistencyReplicaSet=false,StaleControllerConsistencyStatefulSet=false
start_kcm() {
  start kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig="$ADMIN_KC" \
    --controllers='*' \
    --leader-elect=false \
    --secure-port=0 \
    --use-service-account-credentials=false \
    --service-account-private-key-file="$PKI/sa.key" \
    --root-ca-file="$PKI/ca.crt" \
    --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
    --service-cluster-ip-range="$SVC_CIDR" \
    --enable-hostpath-provisioner \
    --pv-recycler-pod-template-filepath-hostpath="$HERE/hostpath-recycler-pod.yaml" \
    --feature-gates="$KCM_FEATURE_GATES" \
    --profiling=false
}

# The default StorageClass `standard` (as kind and minikube name theirs), served by the host-path
# provisioner above. Immediate binding: a hostPath volume has no node affinity, so waiting for the
# first consumer would only delay it. Created if missing; an existing one is left alone.
STORAGE_CLASS='{"apiVersion":"storage.k8s.io/v1","kind":"StorageClass",
 "metadata":{"name":"standard","annotations":{"storageclass.kubernetes.io/is-default-class":"true"}},
 "provisioner":"kubernetes.io/host-path","reclaimPolicy":"Delete","volumeBindingMode":"Immediate"}'
ensure_storage_class() {
  local out
  api GET /apis/storage.k8s.io/v1/storageclasses/standard >/dev/null 2>&1 && return 0
  log "creating the default StorageClass standard (kubernetes.io/host-path)"
  out=$(api POST /apis/storage.k8s.io/v1/storageclasses "$STORAGE_CLASS" 2>&1) ||
    [[ "$out" == *AlreadyExists* ]] || fail kube-apiserver "could not create StorageClass standard: $out"
}

# kube-apiserver, with the same flags on a fresh start and when an old cluster is upgraded. Needs
# ETCD_PORT and API_PORT.
# --bind-address=0.0.0.0: Pods on the real node (node-up.sh) reach it at the machine's address, through
# the `kubernetes` Service (10.96.0.1:443, whose EndpointSlice node-up.sh writes: with
# --endpoint-reconciler-type=none the server writes none, and its loopback advertise address could not
# be an endpoint anyway). --kubelet-preferred-address-types: `kubectl logs` reaches the real node's
# kubelet at its InternalIP (its host name resolves nowhere). PodNodeSelector and
# PodTolerationRestriction (upstream admission plugins, off by default): a namespace annotated
# scheduler.alpha.kubernetes.io/node-selector and .../defaultTolerations sends all its Pods to the real
# node — the hub's, the hooks', and the Pods hooks ask for, none of which say so themselves. Namespaces
# without the annotations are not touched.
ADMISSION_PLUGINS=PodNodeSelector,PodTolerationRestriction
# --audit-*: audit-policy.yaml records only the ServiceAccounts of namespace metahook-audited (what
# tests/namespaces.rs reads back, see AUDIT_LOG), at Metadata level; nobody else's requests are written.
AUDIT_POLICY=$HERE/audit-policy.yaml
AUDIT_LOG=$LOGS/audit.log
start_apiserver() {
  start kube-apiserver "$BIN/kube-apiserver" \
    --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --bind-address=0.0.0.0 --secure-port="$API_PORT" \
    --advertise-address=127.0.0.1 --endpoint-reconciler-type=none \
    --kubelet-preferred-address-types=InternalIP,Hostname \
    --enable-admission-plugins="$ADMISSION_PLUGINS" \
    --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --client-ca-file="$PKI/ca.crt" \
    --authorization-mode=Node,RBAC \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
    --service-cluster-ip-range="$SVC_CIDR" \
    --allow-privileged=true \
    --enable-priority-and-fairness=false \
    --audit-policy-file="$AUDIT_POLICY" \
    --audit-log-path="$AUDIT_LOG" --audit-log-maxsize=50 --audit-log-maxbackup=1 \
    --profiling=false
}

# Stops a component (TERM, then KILL after 10 s) and keeps its last log as <name>.log.1.
stop_component() { # <name>
  local pid
  pid=$(alive_pid "$1") || return 0
  kill -TERM "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + 10))
  while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
  kill -KILL "$pid" 2>/dev/null || true
  mv -f "$LOGS/$1.log" "$LOGS/$1.log.1" 2>/dev/null || true
}

# A cluster started by an older up.sh is brought to today's shape in place, keeping its state (etcd,
# ports, certificates): a kube-apiserver without today's audit flags is restarted with them (its state
# is etcd's; the other components reconnect), a kube-controller-manager without the host-path
# provisioner or today's feature gates is restarted with today's flags (it keeps no state of its own),
# and a missing default StorageClass is created.
upgrade_running_cluster() {
  local pid
  pid=$(alive_pid kube-apiserver)
  if ! tr '\0' '\n' <"/proc/$pid/cmdline" | grep -qx -- "--audit-policy-file=$AUDIT_POLICY" ||
    ! tr '\0' '\n' <"/proc/$pid/cmdline" | grep -qx -- "--enable-admission-plugins=$ADMISSION_PLUGINS"; then
    log "kube-apiserver runs without today's flags; restarting it with today's flags and certificate names"
    (cd "$PKI" && sign_apiserver) >/dev/null 2>"$LOGS/pki.log" || fail pki "openssl failed"
    ETCD_PORT=$(sed -n 's/^CLUSTER_ETCD_PORT=//p' "$CL/env")
    stop_component kube-apiserver
    start_apiserver
    wait_for kube-apiserver "kube-apiserver /readyz on port $API_PORT" readyz
  fi
  grep -q '^CLUSTER_AUDIT_LOG=' "$CL/env" || echo "CLUSTER_AUDIT_LOG=$AUDIT_LOG" >>"$CL/env"
  pid=$(alive_pid kube-controller-manager)
  local cmdline
  cmdline=$(tr '\0' '\n' <"/proc/$pid/cmdline")
  if ! grep -qx -- --enable-hostpath-provisioner <<<"$cmdline" ||
    ! grep -qx -- "--feature-gates=$KCM_FEATURE_GATES" <<<"$cmdline"; then
    log "kube-controller-manager runs with older flags; restarting it with today's flags"
    stop_component kube-controller-manager
    start_kcm
    sleep 1
    alive_pid kube-controller-manager >/dev/null || fail kube-controller-manager "process exited after the restart"
  fi
  ensure_storage_class
}

# ---------------------------------------------------------------------------------------------
# Reuse or clean up

# One up/down at a time (lock lives in the ignored bin/ dir because down.sh removes .cluster/).
mkdir -p "$BIN"
exec 9>"$BIN/.cluster.lock"
flock -w 600 9 || { log "FAILED: another up.sh/down.sh holds $BIN/.cluster.lock"; exit 1; }
export CLUSTER_LOCK_HELD=1 # down.sh, called from here, must not try to take it again

if [ -d "$CL" ]; then
  all_alive=1
  for c in "${COMPONENTS[@]}"; do alive_pid "$c" >/dev/null || { all_alive=0; break; }; done
  API_PORT=$(sed -n 's/^CLUSTER_API_PORT=//p' "$CL/env" 2>/dev/null || true)
  if [ $all_alive = 1 ] && [ -s "$KUBECONFIG_OUT" ] && readyz; then
    log "reusing running cluster (apiserver https://127.0.0.1:$API_PORT)"
    upgrade_running_cluster
    echo "$KUBECONFIG_OUT"
    exit 0
  fi
  log "found a stale or half-dead cluster in $CL; tearing it down"
  bash "$HERE/down.sh" >&2
fi

# ---------------------------------------------------------------------------------------------
# Build, ports

# Ctrl-C / TERM mid-start: clean up like any other failure instead of leaving strays.
trap 'fail "${CURRENT:-up.sh}" "interrupted"' INT TERM

t0=$SECONDS
for t in curl openssl python3 setsid base64; do
  command -v "$t" >/dev/null || { log "FAILED: $t not found in PATH"; exit 1; }
done
bash "$HERE/build.sh" || { log "FAILED: tests/cluster/build.sh"; exit 1; }

mkdir -p "$PKI" "$LOGS" "$PIDS" "$CL/etcd"
chmod 700 "$CL/etcd" # etcd warns otherwise
chmod 700 "$CL"
tstart=$SECONDS

ETCD_PORT=$(free_port)
ETCD_PEER_PORT=$(free_port)
API_PORT=${CLUSTER_FIXED_API_PORT:-$(free_port)}
while [ "$ETCD_PEER_PORT" = "$ETCD_PORT" ]; do ETCD_PEER_PORT=$(free_port); done
while [ "$API_PORT" = "$ETCD_PORT" ] || [ "$API_PORT" = "$ETCD_PEER_PORT" ]; do API_PORT=$(free_port); done

# ---------------------------------------------------------------------------------------------
# etcd (+ PKI and kubeconfig while it boots)

start etcd "$BIN/etcd" \
  --name=metahook --data-dir="$CL/etcd" \
  --listen-client-urls="http://127.0.0.1:$ETCD_PORT" --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster="metahook=http://127.0.0.1:$ETCD_PEER_PORT" \
  --unsafe-no-fsync --log-level=warn
# The PKI is generated while etcd boots (etcd does not need it).
log "generating PKI in $PKI"
(
  cd "$PKI"
  exec 2>"$LOGS/pki.log"
  set -e
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 -subj /CN=metahook-testenv-ca \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,digitalSignature,keyCertSign,cRLSign
  sign_apiserver
  sign admin '/O=system:masters/CN=metahook-admin' \
    'keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE'
  openssl genrsa -out sa.key 2048
  openssl rsa -in sa.key -pubout -out sa.pub
) >/dev/null || fail pki "openssl failed"
b64() { base64 -w0 <"$1"; }
# Components use admin.kubeconfig; tests get a copy at .cluster/kubeconfig, written only once the
# cluster is ready (its presence is part of the reuse check).
cat >"$ADMIN_KC" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: metahook-testenv
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority-data: $(b64 "$PKI/ca.crt")
users:
- name: metahook-admin
  user:
    client-certificate-data: $(b64 "$PKI/admin.crt")
    client-key-data: $(b64 "$PKI/admin.key")
contexts:
- name: metahook-testenv
  context:
    cluster: metahook-testenv
    user: metahook-admin
    namespace: default
current-context: metahook-testenv
EOF
chmod 600 "$ADMIN_KC"

cat >"$CL/env" <<EOF
KUBECONFIG=$KUBECONFIG_OUT
CLUSTER_API_PORT=$API_PORT
CLUSTER_API_SERVER=https://127.0.0.1:$API_PORT
CLUSTER_ETCD_PORT=$ETCD_PORT
CLUSTER_CA=$PKI/ca.crt
CLUSTER_ADMIN_CERT=$PKI/admin.crt
CLUSTER_ADMIN_KEY=$PKI/admin.key
CLUSTER_BIN=$BIN
CLUSTER_LOGS=$LOGS
CLUSTER_AUDIT_LOG=$AUDIT_LOG
EOF

etcd_healthy() { curl -sf --max-time 2 "http://127.0.0.1:$ETCD_PORT/health" 2>/dev/null | grep -q '"health":"true"'; }
wait_for etcd "etcd /health" etcd_healthy

# ---------------------------------------------------------------------------------------------
# kube-apiserver

start_apiserver
wait_for kube-apiserver "kube-apiserver /readyz on port $API_PORT" readyz
# Early, so the apiserver's DefaultStorageClass admission has seen it before any test creates a claim.
ensure_storage_class

# ---------------------------------------------------------------------------------------------
# Controllers, scheduler, fake nodes (all with the admin kubeconfig)

start_kcm

start kube-scheduler "$BIN/kube-scheduler" \
  --kubeconfig="$ADMIN_KC" \
  --leader-elect=false \
  --secure-port=0 \
  --profiling=false

# kwok manages only Nodes annotated kwok.x-k8s.io/node=fake (we create them below). Its Stages
# (bin/kwok-stages.yaml) make them Ready with Lease heartbeats, and make their Pods Running/Ready;
# kwok-extra-stages.yaml adds our own (Pods labelled examples.metahook.dev/fake-complete succeed).
start kwok "$BIN/kwok" \
  --kubeconfig="$ADMIN_KC" \
  --config="$BIN/kwok-stages.yaml" \
  --config="$HERE/kwok-extra-stages.yaml" \
  --manage-all-nodes=false \
  --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
  --node-lease-duration-seconds=40 \
  --cidr=10.244.0.1/16 \
  --node-ip=127.0.0.1

for i in $(seq 1 "$FAKE_NODES"); do
  node=fake-node-$i
  body=$(
    cat <<EOF
{"apiVersion":"v1","kind":"Node","metadata":{"name":"$node",
 "annotations":{"kwok.x-k8s.io/node":"fake"},
 "labels":{"kubernetes.io/hostname":"$node","kubernetes.io/os":"linux","kubernetes.io/arch":"amd64","type":"kwok"}},
 "spec":{},
 "status":{"capacity":{"cpu":"32","memory":"256Gi","pods":"110"},
           "allocatable":{"cpu":"32","memory":"256Gi","pods":"110"}}}
EOF
  )
  out=$(api POST /api/v1/nodes "$body" 2>&1) || fail kube-apiserver "could not create Node $node: $out"
done

nodes_ready() {
  local out
  out=$(api GET /api/v1/nodes 2>/dev/null) || return 1
  python3 -c '
import json, sys
want = int(sys.argv[1])
items = json.load(sys.stdin)["items"]
def ready(n):
    conds = n.get("status", {}).get("conditions", [])
    untainted = not any(t.get("key") == "node.kubernetes.io/not-ready" for t in n.get("spec", {}).get("taints", []))
    return untainted and any(c["type"] == "Ready" and c["status"] == "True" for c in conds)
sys.exit(0 if sum(map(ready, items)) >= want else 1)' "$FAKE_NODES" <<<"$out"
}
wait_for kwok "$FAKE_NODES fake nodes Ready (and untainted by the node lifecycle controller)" nodes_ready

for c in kube-controller-manager kube-scheduler; do
  alive_pid "$c" >/dev/null || fail "$c" "process exited"
done

cp "$ADMIN_KC" "$KUBECONFIG_OUT.tmp" && mv -f "$KUBECONFIG_OUT.tmp" "$KUBECONFIG_OUT"

log "cluster ready in $((SECONDS - tstart)) s (total $((SECONDS - t0)) s incl. build check): apiserver https://127.0.0.1:$API_PORT, $FAKE_NODES fake nodes"
log "logs: $LOGS   env: $CL/env"
echo "$KUBECONFIG_OUT"
