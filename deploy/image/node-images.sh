#!/usr/bin/env bash
# Builds the container images a real Kubernetes node of the local test cluster (or an air-gapped
# cluster) runs, as OCI image archives, without a container engine and without pulling anything: the
# node has no network, so every image it runs must exist locally, and a local registry
# (deploy/image/registry, built here into tests/cluster/bin/registry) serves them as the mirror of
# every registry containerd knows (hosts.toml), so Pods whose imagePullPolicy is Always still "pull".
#
#   OUTDIR/pause.tar         registry.k8s.io/pause:3.10 — our own static pause (pause/main.go, built
#                            with the pinned go.mod): /pause, blocks until SIGTERM/SIGINT, reaps
#                            children; runs as 65535
#   OUTDIR/busybox.tar       docker.io/library/busybox:latest — Debian's busybox-static: /bin/busybox
#                            and a symbolic link in /bin for every applet `busybox --list` names;
#                            entrypoint sh, runs as root (the image's user is unset), like busybox's
#   OUTDIR/hooks-python.tar  metahook.local/hooks-python:<Cargo.toml version> — Debian's python3 (3.11)
#                            and its dependency closure, the CA bundle, the hook helper library at
#                            /opt/metahook-hooks/metahook_hooks (PYTHONPATH=/opt/metahook-hooks: the
#                            examples' ConfigMap mounted at that path shadows it); entrypoint python3,
#                            user 65532:65532
#   OUTDIR/hooks-node.tar    metahook.local/hooks-node:<version> — the nodejs package apt offers (20.x,
#                            NodeSource's; repacked from this host's installation when its repository
#                            is not configured) and its closure, the JS helper library at
#                            /opt/metahook-hooks (where the examples mount theirs and hook.mjs imports
#                            ../metahook-hooks/index.js) and /node_modules/metahook-hooks, a link to it,
#                            so require("metahook-hooks") and import "metahook-hooks" resolve from any
#                            file (NODE_PATH=/node_modules too); entrypoint node, user 65532:65532
#
# How (deploy/image/debs.sh, shared with build.sh's approach): each Debian package of the host's
# architecture fetched once with `apt-get download` into DEB_CACHE (default target/image-debs/),
# unpacked whole with `dpkg-deb -x`, its dpkg status kept in /var/lib/dpkg/status.d/ as distroless
# keeps it (image scanners see what is inside); maintainer scripts never run. The closure follows
# Depends and Pre-Depends (first alternative), except what only maintainer scripts or tools the
# image does not run need: dpkg (python3-minimal), python3 (nodejs: npm's node-gyp),
# ca-certificates' openssl and debconf. Dropped after unpacking, to keep the images lean (the
# status.d md5sums still list these files, as distroless's do): /usr/share/{doc,man,info,locale,
# lintian}; in hooks-node also the C headers (/usr/include) and npm and corepack (no package manager
# in the image). /etc/passwd and /etc/group name root, nonroot (65532) and nobody (65534, the user the
# examples' Deployments run as); /tmp is 1777. Nothing needs writing outside /tmp
# (readOnlyRootFilesystem): PYTHONDONTWRITEBYTECODE=1, and no .pyc is precompiled.
#
# When run as root, each image's root filesystem is checked with chroot as user 65534 (python3 imports
# json, http.server, ssl, ... and metahook_hooks; node requires and imports metahook-hooks).
#
# Reproducible: every file and the image config carry the time SOURCE_DATE_EPOCH (default: the last
# commit's time), entries are sorted and owned by root (ocibuild), the pause binary is built with
# -trimpath and no build id. A no-op when OUTDIR/.<image>.stamp matches: a hash of this script,
# debs.sh, ocibuild's stamp, the Go toolchain (pause), the packages' versions and the libraries' files.
#
#   deploy/image/node-images.sh OUTDIR
# Env: VERSION (default: Cargo.toml's), DEB_CACHE, SOURCE_DATE_EPOCH, FORCE=1 (rebuild everything,
#      tools included), KEEP_ROOTFS=DIR (also leave each root filesystem in DIR/<image>),
#      GO_BUILD_P (default 2), MC_EXAMPLES=DIR (only the stand-ins for Metacontroller's examples, below).
# Needs a Debian host (dpkg, apt-get with its package lists: `apt-get update` once), go (the module
# proxy or a filled module cache), and the Debian mirror for packages not cached yet.
# Serve them: tests/cluster/bin/registry -addr 127.0.0.1:5000 -image OUTDIR/pause.tar -image ...
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BIN=$ROOT/tests/cluster/bin
OUTDIR=${1:?usage: deploy/image/node-images.sh OUTDIR}
VERSION=${VERSION:-$(awk -F'"' '/^\[/ { s = $0 } s == "[package]" && /^version *=/ { print $2; exit }' "$ROOT/Cargo.toml")}
DEB_CACHE=${DEB_CACHE:-$ROOT/target/image-debs}
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
  SOURCE_DATE_EPOCH=$(git -C "$ROOT" log -1 --format=%ct 2>/dev/null || echo 0)
fi
export SOURCE_DATE_EPOCH
PATH_ENV=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

log() { printf '[images] %s\n' "$*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}
# shellcheck source=deploy/image/debs.sh
. "$HERE/debs.sh"

for tool in dpkg dpkg-deb dpkg-query apt-get apt-cache go flock sha256sum; do
  command -v "$tool" >/dev/null || die "$tool not found: the images are built from Debian packages on a Debian host, with go"
done
ARCH=$(dpkg --print-architecture)
# The images' platform, as OCI (Go's GOARCH) names Debian's architectures.
case $ARCH in
  amd64 | arm64 | s390x | riscv64 | loong64) OCI_ARCH=$ARCH VARIANT= ;;
  armhf) OCI_ARCH=arm VARIANT=v7 ;;
  armel) OCI_ARCH=arm VARIANT=v5 ;;
  i386) OCI_ARCH=386 VARIANT= ;;
  ppc64el) OCI_ARCH=ppc64le VARIANT= ;;
  mips64el) OCI_ARCH=mips64le VARIANT= ;;
  *) die "no OCI name known for Debian architecture $ARCH" ;;
esac
mkdir -p "$OUTDIR" "$BIN"
OUTDIR=$(cd "$OUTDIR" && pwd)

# ---- the tools: ocibuild (exactly as build.sh builds and stamps it) and the registry ---------------
# go_tool NAME PACKAGE STAMP-HASH: tests/cluster/bin/NAME built from deploy/image/PACKAGE, unless its
# stamp matches (one build at a time: build.sh takes the same lock for ocibuild).
go_tool() {
  local name=$1 pkg=$2 want=$3 start
  exec 9>"$BIN/.$name.lock"
  flock -w 1800 9 || die "timed out waiting for another build of $name"
  if [ "${FORCE:-0}" = 1 ] || [ ! -x "$BIN/$name" ] || [ "$(cat "$BIN/.$name.stamp" 2>/dev/null)" != "$want" ]; then
    log "building $name (go-containerregistry $(awk '$1 == "require" && $2 ~ /go-containerregistry/ { print $3 }' "$HERE/go.mod"))..."
    start=$SECONDS
    (cd "$HERE" && CGO_ENABLED=0 go build -p "${GO_BUILD_P:-2}" -trimpath -ldflags "-s -w" -o "$BIN/$name.tmp" "$pkg") ||
      die "go build of $name ($pkg) failed"
    mv -f "$BIN/$name.tmp" "$BIN/$name"
    echo "$want" >"$BIN/.$name.stamp"
    log "built $name in $((SECONDS - start)) s"
  fi
  flock -u 9
  exec 9>&-
}
go_tool ocibuild . "$( (cd "$HERE" && cat go.mod go.sum ./*.go build.sh) | sha256sum | cut -d' ' -f1)"
go_tool registry ./registry "$( (cd "$HERE" && cat go.mod go.sum registry/*.go) | sha256sum | cut -d' ' -f1)"
OCIBUILD=$BIN/ocibuild

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# ---- helpers ---------------------------------------------------------------------------------------
# packages ARRAY ROOT...: the closure (name -> version) of ROOT, with this script's exclusions.
declare -A DEB_SKIP=([dpkg]=1) DEB_NODEPS=([ca-certificates]=1 [base-files]=1)
# versions ARRAY: "name=version" lines, sorted (for the stamp and the log).
versions() {
  local -n _v=$1
  local p
  for p in "${!_v[@]}"; do printf '%s=%s\n' "$p" "${_v[$p]}"; done | LC_ALL=C sort
}
# fresh NAME INPUT: true (the image is up to date) when OUTDIR/NAME.tar exists and OUTDIR/.NAME.stamp
# holds the hash of INPUT and what every image depends on; else sets STAMP_WANT for done_image.
fresh() {
  STAMP_WANT=$({
    printf '%s\n' "$2" "$SOURCE_DATE_EPOCH" "$OCI_ARCH" "$VARIANT"
    cat "$HERE/node-images.sh" "$HERE/debs.sh" "$BIN/.ocibuild.stamp"
  } | sha256sum | cut -d' ' -f1)
  [ "${FORCE:-0}" != 1 ] && [ -f "$OUTDIR/$1.tar" ] && [ "$(cat "$OUTDIR/.$1.stamp" 2>/dev/null)" = "$STAMP_WANT" ]
}
# files_hash DIR FILE...: a hash of the files' names and contents.
files_hash() {
  local dir=$1
  shift
  (cd "$dir" && for f in "$@"; do printf '%s\n' "$f" && cat "$f"; done) | sha256sum | cut -d' ' -f1
}
# unpack ROOTFS ARRAY: the packages' .debs fetched and unpacked, each logged.
unpack() {
  local rootfs=$1 p debs=()
  local -n _u=$2
  for p in $(printf '%s\n' "${!_u[@]}" | LC_ALL=C sort); do
    debs+=("$(deb_fetch "$p" "${_u[$p]}")")
  done
  deb_unpack "$rootfs" "${debs[@]}"
}
# image NAME REF ROOTFS OCIBUILD-ARGS...: OUTDIR/NAME.tar, its stamp, its size logged.
image() {
  local name=$1 ref=$2 rootfs=$3 digest
  shift 3
  if [ -n "${KEEP_ROOTFS:-}" ]; then
    rm -rf "${KEEP_ROOTFS:?}/$name" && mkdir -p "$KEEP_ROOTFS/$name" && cp -a "$rootfs/." "$KEEP_ROOTFS/$name/"
  fi
  digest=$("$OCIBUILD" -rootfs "$rootfs" -out "$OUTDIR/$name.tar.tmp" -ref "$ref" -arch "$OCI_ARCH" \
    ${VARIANT:+-variant "$VARIANT"} -label "org.opencontainers.image.source=https://github.com/metahook/metahook" \
    "$@" | awk '{ print $2 }') || die "ocibuild of $name failed"
  mv -f "$OUTDIR/$name.tar.tmp" "$OUTDIR/$name.tar"
  echo "$STAMP_WANT" >"$OUTDIR/.$name.stamp"
  log "$ref -> $OUTDIR/$name.tar ($(du -h "$OUTDIR/$name.tar" | cut -f1), rootfs $(du -sh "$rootfs" | cut -f1)) $digest"
  rm -rf "$rootfs"
}
unchanged() { log "$2 up to date: $OUTDIR/$1.tar ($(du -h "$OUTDIR/$1.tar" | cut -f1))"; }
# check NAME ROOTFS COMMAND...: COMMAND run in the root filesystem as nobody (65534), when root.
check() {
  local name=$1 rootfs=$2
  shift 2
  if [ "$(id -u)" != 0 ]; then
    log "  (not root: $name's chroot check skipped)"
    return
  fi
  env -i "$PATH_ENV" HOME=/nonexistent "${CHECK_ENV[@]}" chroot --userspec=65534:65534 "$rootfs" "$@" >&2 ||
    die "$name: '$*' failed in its root filesystem"
  log "  $name: chroot check passed: $*"
}

# ---- Metacontroller's examples' images (MC_EXAMPLES=<its examples/ directory>) ---------------------
# Only these, then exit: the stand-ins tests/metacontroller-examples.sh runs Metacontroller's own
# examples on, built as the others are (nothing is pulled). What each example's Pod needs of them:
#   docker.io/library/python:3.11, :3.11-slim   Debian's python3 (3.11, the same minor version) and a
#       `python` link to it (the examples run `python /hooks/sync.py`, standard library only); root, as
#       the official image runs.
#   docker.io/metacontroller/nodejs-server:0.1  Debian's nodejs and the examples' own server.js
#       (examples/nodejs, the image's whole source), run as `node /node/server.js` in /node, root.
# (metacontroller/jsonnetd has no source here: the two service-per-pod examples are not run.)
if [ -n "${MC_EXAMPLES:-}" ]; then
  [ -f "$MC_EXAMPLES/nodejs/server.js" ] || die "MC_EXAMPLES=$MC_EXAMPLES has no nodejs/server.js"
  declare -A PYTHON=()
  deb_closure PYTHON python3 ca-certificates base-files
  for tag in 3.11 3.11-slim; do
    REF=docker.io/library/python:$tag
    if fresh "mc-python-$tag" "$REF $(versions PYTHON)"; then
      unchanged "mc-python-$tag" "$REF"
      continue
    fi
    rootfs=$WORK/mc-python-$tag
    install -d -m 0755 "$rootfs"
    unpack "$rootfs" PYTHON
    deb_ca_bundle "$rootfs"
    deb_accounts "$rootfs"
    deb_slim "$rootfs"
    ln -s python3 "$rootfs/usr/bin/python"
    CHECK_ENV=()
    check "mc-python-$tag" "$rootfs" python -c 'import json, http.server, io, copy, logging, re, ssl, pathlib, typing'
    image "mc-python-$tag" "$REF" "$rootfs" -entrypoint python3 -user '' -env "$PATH_ENV" -env PYTHONUNBUFFERED=1 \
      -env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
  done
  REF=docker.io/metacontroller/nodejs-server:0.1
  declare -A NODE=()
  DEB_SKIP[python3]=1
  deb_closure NODE nodejs ca-certificates base-files
  if fresh mc-nodejs-server "$REF $(versions NODE) $(files_hash "$MC_EXAMPLES/nodejs" server.js)"; then
    unchanged mc-nodejs-server "$REF"
  else
    rootfs=$WORK/mc-nodejs-server
    install -d -m 0755 "$rootfs"
    unpack "$rootfs" NODE
    deb_ca_bundle "$rootfs"
    deb_accounts "$rootfs"
    deb_slim "$rootfs"
    install -D -m 0644 "$MC_EXAMPLES/nodejs/server.js" "$rootfs/node/server.js"
    CHECK_ENV=()
    check mc-nodejs-server "$rootfs" node --check /node/server.js
    image mc-nodejs-server "$REF" "$rootfs" -entrypoint node -arg /node/server.js -workdir /node -user '' -env "$PATH_ENV"
  fi
  exit 0
fi

# ---- pause -----------------------------------------------------------------------------------------
REF=registry.k8s.io/pause:3.10
if fresh pause "$REF $(go version) $(files_hash "$HERE" go.mod go.sum pause/main.go)"; then
  unchanged pause "$REF"
else
  rootfs=$WORK/pause
  install -d -m 0755 "$rootfs"
  (cd "$HERE" && CGO_ENABLED=0 go build -p "${GO_BUILD_P:-2}" -trimpath -ldflags "-s -w -buildid=" -o "$rootfs/pause" ./pause) ||
    die "go build of pause failed"
  chmod 0755 "$rootfs/pause"
  image pause "$REF" "$rootfs" -entrypoint /pause -user 65535:65535
fi

# ---- busybox ---------------------------------------------------------------------------------------
REF=docker.io/library/busybox:latest
declare -A BUSYBOX=()
deb_closure BUSYBOX busybox-static
if fresh busybox "$REF $(versions BUSYBOX)"; then
  unchanged busybox "$REF"
else
  rootfs=$WORK/busybox
  install -d -m 0755 "$rootfs"
  unpack "$rootfs" BUSYBOX
  [ -x "$rootfs/bin/busybox" ] || die "busybox-static has no /bin/busybox"
  applets=$("$rootfs/bin/busybox" --list) || die "$rootfs/bin/busybox --list failed"
  for applet in $applets; do
    [ -e "$rootfs/bin/$applet" ] || [ -L "$rootfs/bin/$applet" ] || ln -s busybox "$rootfs/bin/$applet"
  done
  for applet in sh echo sleep cat ls env wget true false; do
    [ -L "$rootfs/bin/$applet" ] || die "busybox has no applet $applet"
  done
  log "  busybox: $(wc -w <<<"$applets") applets"
  deb_accounts "$rootfs"
  deb_slim "$rootfs"
  CHECK_ENV=()
  check busybox "$rootfs" /bin/sh -c 'echo hello | cat | grep -q hello && ls / | grep -q bin && env | grep -q PATH= && true && ! false'
  image busybox "$REF" "$rootfs" -entrypoint sh -user '' -env "$PATH_ENV"
fi

# ---- hooks-python ----------------------------------------------------------------------------------
REF=metahook.local/hooks-python:$VERSION
PYLIB=$ROOT/examples-python/metahook-hooks/metahook_hooks
mapfile -t pyfiles < <(cd "$PYLIB" && find . -maxdepth 1 -type f \( -name '*.py' -o -name py.typed \) | sed 's|^\./||' | LC_ALL=C sort)
[ "${#pyfiles[@]}" -gt 0 ] || die "no Python files in $PYLIB"
declare -A PYTHON=()
deb_closure PYTHON python3 ca-certificates base-files
if fresh hooks-python "$REF $(versions PYTHON) $(files_hash "$PYLIB" "${pyfiles[@]}")"; then
  unchanged hooks-python "$REF"
else
  rootfs=$WORK/hooks-python
  install -d -m 0755 "$rootfs"
  unpack "$rootfs" PYTHON
  deb_ca_bundle "$rootfs"
  deb_accounts "$rootfs"
  deb_slim "$rootfs"
  [ -x "$rootfs/usr/bin/python3" ] || die "no /usr/bin/python3 in the python3 packages"
  install -d -m 0755 "$rootfs/opt/metahook-hooks/metahook_hooks"
  for f in "${pyfiles[@]}"; do
    install -m 0644 "$PYLIB/$f" "$rootfs/opt/metahook-hooks/metahook_hooks/$f"
  done
  CHECK_ENV=(PYTHONPATH=/opt/metahook-hooks PYTHONDONTWRITEBYTECODE=1 SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt)
  check hooks-python "$rootfs" python3 -c 'import json, http.server, ssl, socketserver, threading, urllib.request, hashlib, hmac, base64, logging, signal, datetime, zoneinfo, metahook_hooks; ssl.create_default_context().load_verify_locations("/etc/ssl/certs/ca-certificates.crt")'
  image hooks-python "$REF" "$rootfs" -entrypoint python3 -user 65532:65532 -env "$PATH_ENV" \
    -env PYTHONPATH=/opt/metahook-hooks -env PYTHONDONTWRITEBYTECODE=1 -env PYTHONUNBUFFERED=1 \
    -env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    -label "org.opencontainers.image.title=hooks-python" -label "org.opencontainers.image.version=$VERSION"
fi

# ---- hooks-node ------------------------------------------------------------------------------------
REF=metahook.local/hooks-node:$VERSION
JSLIB=$ROOT/examples-js/metahook-hooks
mapfile -t jsfiles < <(cd "$JSLIB" && { printf '%s\n' package.json index.js index.d.ts wire.d.ts README.md && find src -type f; } | LC_ALL=C sort)
declare -A NODE=()
DEB_SKIP[python3]=1 # nodejs depends on it for npm's node-gyp, not in the image
deb_closure NODE nodejs ca-certificates base-files
unset 'DEB_SKIP[python3]'
if fresh hooks-node "$REF $(versions NODE) $(files_hash "$JSLIB" "${jsfiles[@]}")"; then
  unchanged hooks-node "$REF"
else
  rootfs=$WORK/hooks-node
  install -d -m 0755 "$rootfs"
  unpack "$rootfs" NODE
  deb_ca_bundle "$rootfs"
  deb_accounts "$rootfs"
  deb_slim "$rootfs"
  rm -rf "$rootfs/usr/include" "$rootfs/usr/lib/node_modules/npm" "$rootfs/usr/lib/node_modules/corepack"
  for link in "$rootfs"/usr/bin/*; do # npm, npx, corepack: now dangling
    if [ -L "$link" ] && [ ! -e "$link" ]; then rm -f "$link"; fi
  done
  rmdir "$rootfs/usr/lib/node_modules" 2>/dev/null || true
  [ -x "$rootfs/usr/bin/node" ] || die "no /usr/bin/node in the nodejs package"
  for f in "${jsfiles[@]}"; do
    install -D -m 0644 "$JSLIB/$f" "$rootfs/opt/metahook-hooks/$f"
  done
  find "$rootfs/opt" -type d -exec chmod 0755 {} +
  install -d -m 0755 "$rootfs/node_modules"
  ln -s ../opt/metahook-hooks "$rootfs/node_modules/metahook-hooks"
  CHECK_ENV=(NODE_PATH=/node_modules)
  check hooks-node "$rootfs" node -e 'require("metahook-hooks"); require("http"); require("https"); require("crypto"); import("metahook-hooks").then((m) => { if (typeof m.serve !== "function") process.exit(1); })'
  image hooks-node "$REF" "$rootfs" -entrypoint node -user 65532:65532 -env "$PATH_ENV" -env NODE_PATH=/node_modules \
    -env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    -label "org.opencontainers.image.title=hooks-node" -label "org.opencontainers.image.version=$VERSION"
fi
log "images in $OUTDIR: $(cd "$OUTDIR" && du -ch pause.tar busybox.tar hooks-python.tar hooks-node.tar | tail -1 | cut -f1) in all"
