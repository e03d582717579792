#!/usr/bin/env bash
# Builds the real node's binaries into tests/cluster/bin/ from pinned Go modules (node-up.sh runs it):
#   testenv/    (k8s.io/kubernetes, the control plane's own module and version): kubelet kube-proxy
#   containerd/ (github.com/containerd/containerd/v2, its own module): containerd containerd-shim-runc-v2 ctr
#   coredns/    (github.com/coredns/coredns, its own module): coredns
# runc and the CNI plugins are Debian packages (node-up.sh checks for them).
#
# A no-op when bin/.node-stamp holds the hash of the module files and of this script and every output
# exists. Env: GO_BUILD_P (go build -p, default 2), FORCE=1.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN=$HERE/bin
P=${GO_BUILD_P:-2}
K8S_VERSION=v1.36.3 # the control plane's (build.sh checks testenv/go.mod pins it)

log() { printf '[node-build] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

command -v go >/dev/null || die "go not found in PATH"
mkdir -p "$BIN"
exec 8>"$BIN/.node-build.lock"
flock -w 3600 8 || die "timed out waiting for another node-build.sh to finish"

# name -> module dir, package, build tags; cold-build figures on 2 cores with the control plane's
# packages already in Go's build cache (shown so nobody thinks we hung).
OUTPUTS=(kubelet kube-proxy containerd containerd-shim-runc-v2 ctr coredns)
declare -A MOD=([kubelet]=testenv [kube-proxy]=testenv [containerd]=containerd
  [containerd-shim-runc-v2]=containerd [ctr]=containerd [coredns]=coredns)
declare -A PKG=([kubelet]=k8s.io/kubernetes/cmd/kubelet [kube-proxy]=k8s.io/kubernetes/cmd/kube-proxy
  [containerd]=github.com/containerd/containerd/v2/cmd/containerd
  [containerd-shim-runc-v2]=github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
  [ctr]=github.com/containerd/containerd/v2/cmd/ctr [coredns]=github.com/coredns/coredns)
declare -A COLD=([kubelet]="~0.5 min" [kube-proxy]="~0.2 min" [containerd]="~1.5 min"
  [containerd-shim-runc-v2]="~0.3 min" [ctr]="~0.3 min" [coredns]="~2 min")
# containerd: no storage drivers this machine lacks (they need cgo or kernel features).
CONTAINERD_TAGS="no_btrfs no_devmapper no_zfs no_aufs"

stamp_hash() {
  (cd "$HERE" && find testenv containerd coredns -type f \( -name go.mod -o -name go.sum -o -name '*.go' \) -print0 |
    LC_ALL=C sort -z | xargs -0 cat; cat "$HERE/node-build.sh") | sha256sum | cut -d' ' -f1
}
WANT=$(stamp_hash)
todo=()
for b in "${OUTPUTS[@]}"; do [ -s "$BIN/$b" ] || todo+=("$b"); done
if [ "${FORCE:-0}" = 1 ] || [ "$WANT" != "$(cat "$BIN/.node-stamp" 2>/dev/null || true)" ]; then
  todo=("${OUTPUTS[@]}") # go's build cache makes unchanged ones cheap
fi
if [ ${#todo[@]} -eq 0 ]; then
  log "node binaries up to date ($BIN)"
  exit 0
fi
rm -f "$BIN/.node-stamp"

K8S_LDFLAGS="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION \
-X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)"
CONTAINERD_VERSION=$(awk '{ sub(/^require /, "") } $1 == "github.com/containerd/containerd/v2" { print $2 }' "$HERE/containerd/go.mod")
[ -n "$CONTAINERD_VERSION" ] || die "containerd/go.mod requires no github.com/containerd/containerd/v2"
# The CRI version answer must name it: the kubelet refuses a runtime whose version is empty.
CONTAINERD_LDFLAGS="-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"
t0=$SECONDS
for b in "${todo[@]}"; do
  start=$SECONDS
  log "building $b (cold: ${COLD[$b]})"
  case ${MOD[$b]} in
    testenv) flags=(-tags=notest -ldflags "$K8S_LDFLAGS") ;;
    containerd) flags=(-tags "$CONTAINERD_TAGS" -ldflags "$CONTAINERD_LDFLAGS") ;;
    *) flags=(-ldflags "-s -w") ;;
  esac
  (cd "$HERE/${MOD[$b]}" && CGO_ENABLED=0 go build -p "$P" -trimpath "${flags[@]}" -o "$BIN/$b.tmp" "${PKG[$b]}") ||
    die "go build ${PKG[$b]} failed"
  mv -f "$BIN/$b.tmp" "$BIN/$b"
  log "built $b in $((SECONDS - start)) s"
done
echo "$WANT" >"$BIN/.node-stamp"
log "node binaries built in $((SECONDS - t0)) s"
