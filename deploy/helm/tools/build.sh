#!/usr/bin/env bash
# Builds the real helm CLI (helm.sh/helm/v3, version pinned in go.mod next to this script) into
# tests/cluster/bin/helm, from the Go module proxy. deploy/verify.sh uses it to render the chart.
#
# A no-op when tests/cluster/bin/.helm.stamp holds the hash of go.mod, go.sum, tools.go and this
# script and the binary exists, so callers can run it unconditionally.
# Cold build (empty Go build cache, 2 cores): see deploy/README.md. Progress goes to stderr.
#
# Env: GO_BUILD_P (go build -p, default 2), FORCE=1 (rebuild even if the stamp matches).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
BIN=$ROOT/tests/cluster/bin
OUT=$BIN/helm
STAMP=$BIN/.helm.stamp
P=${GO_BUILD_P:-2}

log() { printf '[helm-build] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

mkdir -p "$BIN"
# Serialise concurrent callers (two test binaries running verify.sh at once).
exec 9>"$BIN/.helm-build.lock"
flock -w 3600 9 || die "timed out waiting for another helm build to finish"

want=$( (cd "$HERE" && cat go.mod go.sum tools.go build.sh) | sha256sum | cut -d' ' -f1)
if [ "${FORCE:-0}" != 1 ] && [ -x "$OUT" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ]; then
  log "helm up to date ($OUT)"
  exit 0
fi
command -v go >/dev/null || die "go not found in PATH (needed to build helm)"

version=$(awk '$1 == "require" && $2 == "helm.sh/helm/v3" { print $3 }' "$HERE/go.mod")
[ -n "$version" ] || die "go.mod does not require helm.sh/helm/v3"
# As helm's own Makefile: the Kubernetes version helm assumes offline (`helm template`, `helm lint`)
# comes from the client-go it is built with (v0.37.x => 1.37); the source default is 1.20.
cgo=$(awk '$1 == "k8s.io/client-go" { print $2 }' "$HERE/go.mod")
[ -n "$cgo" ] || die "go.mod does not list k8s.io/client-go"
kminor=$(echo "$cgo" | cut -d. -f2)
LDFLAGS="-s -w -X helm.sh/helm/v3/internal/version.version=$version"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  LDFLAGS="$LDFLAGS -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$kminor"
done
rm -f "$STAMP"
log "building helm $version (cold build: ~3 min on 2 cores; warm: seconds)..."
start=$SECONDS
# The version ldflag makes `helm version` report the pinned release instead of "v3.22".
(cd "$HERE" && CGO_ENABLED=0 exec go build -p "$P" -trimpath -ldflags "$LDFLAGS" \
  -o "$BIN/.helm.tmp" helm.sh/helm/v3/cmd/helm) &
pid=$!
while kill -0 "$pid" 2>/dev/null; do
  for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  kill -0 "$pid" 2>/dev/null && log "  ... still building helm ($((SECONDS - start)) s elapsed)"
done
rc=0; wait "$pid" || rc=$?
[ "$rc" -eq 0 ] || { rm -f "$BIN/.helm.tmp"; die "go build of helm.sh/helm/v3/cmd/helm failed (exit $rc)"; }
mv -f "$BIN/.helm.tmp" "$OUT"
echo "$want" >"$STAMP"
log "built helm $version in $((SECONDS - start)) s: $("$OUT" version --short 2>/dev/null || echo '?')"
