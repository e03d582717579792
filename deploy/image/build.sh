#!/usr/bin/env bash
# Builds the metahook OCI image archive offline, without a container engine:
#   1. builds ocibuild (main.go here, go-containerregistry pinned in go.mod) into tests/cluster/bin/
#      from the Go module proxy — a no-op when tests/cluster/bin/.ocibuild.stamp matches;
#   2. lays out a root filesystem: /metahook (stripped) and /usr/bin/metacontroller, a symbolic link to it
#      (Metacontroller's chart and manifest run that path: started under that name, the hub reads
#      Metacontroller's flags), the shared libraries it links (glibc's loader,
#      libc, libm, libgcc_s, found with ldd), /etc/ssl/certs/ca-certificates.crt, and /etc/passwd +
#      /etc/group naming the non-root user 65532 ("nonroot", as distroless). No shell, no package manager;
#   3. writes an OCI image archive (a tar of an OCI image layout) running /metahook as 65532:65532.
#
#   deploy/image/build.sh [BINARY] [OUT]
#     BINARY  default target/release/metahook (`make image` builds it first)
#     OUT     default dist/metahook-image.tar
# Env: IMAGE (reference, default ghcr.io/metahook/metahook:<Cargo.toml version>), KEEP_ROOTFS=DIR (also
#      leave the root filesystem there), FORCE=1 (rebuild ocibuild), GO_BUILD_P (default 2),
#      SOURCE_DATE_EPOCH (layer and config times; default 0, so the same inputs give the same digest).
# Load it elsewhere with e.g. `skopeo copy oci-archive:dist/metahook-image.tar docker://REGISTRY/...`
# or `podman load -i dist/metahook-image.tar`.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BIN=$ROOT/tests/cluster/bin
TOOL=$BIN/ocibuild
STAMP=$BIN/.ocibuild.stamp
BINARY=${1:-$ROOT/target/release/metahook}
OUT=${2:-$ROOT/dist/metahook-image.tar}
VERSION=$(awk -F'"' '/^\[/ { s = $0 } s == "[package]" && /^version *=/ { print $2; exit }' "$ROOT/Cargo.toml")
IMAGE=${IMAGE:-ghcr.io/metahook/metahook:$VERSION}

log() { printf '[image] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[ -x "$BINARY" ] || die "no binary at $BINARY (cargo build --release --locked)"
mkdir -p "$BIN"
exec 9>"$BIN/.ocibuild.lock"
flock -w 1800 9 || die "timed out waiting for another ocibuild build"
want=$( (cd "$HERE" && cat go.mod go.sum main.go build.sh) | sha256sum | cut -d' ' -f1)
if [ "${FORCE:-0}" = 1 ] || [ ! -x "$TOOL" ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  command -v go >/dev/null || die "go not found in PATH (needed to build ocibuild)"
  log "building ocibuild (go-containerregistry $(awk '$1 == "require" && $2 ~ /go-containerregistry/ { print $3 }' "$HERE/go.mod"))..."
  start=$SECONDS
  (cd "$HERE" && CGO_ENABLED=0 go build -p "${GO_BUILD_P:-2}" -trimpath -ldflags "-s -w" -o "$TOOL.tmp" .)
  mv -f "$TOOL.tmp" "$TOOL"
  echo "$want" >"$STAMP"
  log "built ocibuild in $((SECONDS - start)) s"
fi
flock -u 9

ROOTFS=$(mktemp -d)
chmod 0755 "$ROOTFS"
trap 'rm -rf "$ROOTFS"' EXIT
install -d -m 0755 "$ROOTFS/etc/ssl/certs" "$ROOTFS/tmp"
chmod 1777 "$ROOTFS/tmp"
install -m 0755 "$BINARY" "$ROOTFS/metahook"
strip --strip-debug "$ROOTFS/metahook"
# A link, not a copy or a hard link (the layer would hold the binary twice); the name is what counts.
install -d -m 0755 "$ROOTFS/usr/bin"
ln -s /metahook "$ROOTFS/usr/bin/metacontroller"
# The dynamic loader and every library the binary links, at the paths ldd resolves them to.
for lib in $(ldd "$BINARY" | grep -oE '/[^ ]+\.so[^ ]*'); do
  real=$(readlink -f "$lib")
  install -D -m 0755 "$real" "$ROOTFS$lib"
done
install -m 0644 /etc/ssl/certs/ca-certificates.crt "$ROOTFS/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
  >"$ROOTFS/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$ROOTFS/etc/group"
if [ -n "${KEEP_ROOTFS:-}" ]; then
  rm -rf "$KEEP_ROOTFS" && mkdir -p "$KEEP_ROOTFS" && cp -a "$ROOTFS/." "$KEEP_ROOTFS/"
fi

mkdir -p "$(dirname "$OUT")"
"$TOOL" -rootfs "$ROOTFS" -out "$OUT" -ref "$IMAGE" -entrypoint /metahook -user 65532:65532 \
  -env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
  -label "org.opencontainers.image.title=metahook" \
  -label "org.opencontainers.image.version=$VERSION" \
  -label "org.opencontainers.image.source=https://github.com/metahook/metahook" >&2
log "$IMAGE -> $OUT ($(du -h "$OUT" | cut -f1), rootfs $(du -sh "$ROOTFS" | cut -f1))"
