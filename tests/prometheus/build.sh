#!/usr/bin/env bash
# Builds the real Prometheus server (github.com/prometheus/prometheus, the version below) into
# tests/cluster/bin/prometheus from the Go module proxy, so tests/metrics.rs can scrape the hub the way a
# Prometheus does: its own HTTP client, TLS checks and bearer-token handling, not a stand-in.
#
# A no-op when tests/cluster/bin/.prometheus.stamp holds the hash of this script and the binary exists.
# The web UI's assets are not built (they need npm and are not embedded without the builtinassets tag);
# the HTTP API the test reads does not need them, nor do its static scrape jobs need service discovery
# (left out with the remove_all_sd build tag). Progress on stderr.
#
# Env: GO_BUILD_P (go build -p, default 2), FORCE=1 (rebuild even if the stamp matches).
set -euo pipefail

VERSION=v0.316.0 # Prometheus 3.16 (the module's tags are v0.<minor * 100 + patch>)

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BIN=$ROOT/tests/cluster/bin
OUT=$BIN/prometheus
STAMP=$BIN/.prometheus.stamp
P=${GO_BUILD_P:-2}

log() { printf '[prometheus-build] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

mkdir -p "$BIN"
# Serialise concurrent callers (several tests in one binary).
exec 9>"$BIN/.prometheus-build.lock"
flock -w 3600 9 || die "timed out waiting for another Prometheus build to finish"

want=$(sha256sum <"$HERE/build.sh" | cut -d' ' -f1)
if [ "${FORCE:-0}" != 1 ] && [ -x "$OUT" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ]; then
  log "prometheus up to date ($OUT)"
  exit 0
fi
command -v go >/dev/null || die "go not found in PATH (needed to build Prometheus)"
rm -f "$STAMP"
log "building prometheus $VERSION (cold: ~10 min on 2 cores; warm: seconds)..."
start=$SECONDS
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# `go install module@version` builds with the module's own go.mod (its pinned dependencies).
# remove_all_sd leaves out every service-discovery plugin (cloud SDKs): the test's scrape jobs are static.
(CGO_ENABLED=0 GOBIN=$tmp exec go install -p "$P" -trimpath -tags remove_all_sd -ldflags "-s -w" \
  "github.com/prometheus/prometheus/cmd/prometheus@$VERSION") &
pid=$!
while kill -0 "$pid" 2>/dev/null; do
  for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  kill -0 "$pid" 2>/dev/null && log "  ... still building prometheus ($((SECONDS - start)) s elapsed)"
done
rc=0; wait "$pid" || rc=$?
[ "$rc" -eq 0 ] || die "go install github.com/prometheus/prometheus/cmd/prometheus@$VERSION failed (exit $rc)"
mv -f "$tmp/prometheus" "$OUT"
echo "$want" >"$STAMP"
log "built prometheus $VERSION in $((SECONDS - start)) s: $("$OUT" --version 2>/dev/null | head -1 || echo '?')"
