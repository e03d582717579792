#!/usr/bin/env bash
# Builds the metahook OCI image archive without a container engine, from Debian packages:
#   1. builds ocibuild (main.go here, go-containerregistry pinned in go.mod) into tests/cluster/bin/
#      from the Go module proxy — a no-op when tests/cluster/bin/.ocibuild.stamp matches;
#   2. fetches the Debian packages of the build host's architecture (`dpkg --print-architecture`) the
#      image is made of, with `apt-get download`, into a cache keyed by package, version and
#      architecture (DEB_CACHE, default target/image-debs/: a second build downloads nothing):
#        - the packages owning every library the binary links (`ldd` + `dpkg -S`: libc6 for glibc's
#          loader, libc and libm; libgcc-s1), and what they depend on (gcc-<n>-base);
#        - ca-certificates (Mozilla's CA certificates) and base-files (/etc/os-release, which tells
#          image scanners the distribution). Their own dependencies (openssl, debconf, ...) serve their
#          maintainer scripts, which never run in the image, so they are not installed;
#   3. lays out a root filesystem: each package unpacked whole (`dpkg-deb -x`), with its dpkg status
#      kept as distroless keeps it — /var/lib/dpkg/status.d/<package> (the control file, marked
#      installed) and /var/lib/dpkg/status.d/<package>.md5sums (its files) — so image scanners (trivy,
#      grype, syft) see what is inside; /etc/ssl/certs/ca-certificates.crt made from the certificates
#      as update-ca-certificates makes it (the package's maintainer script, which does not run here);
#      /etc/passwd and /etc/group naming the non-root user 65532 ("nonroot", as distroless); /metahook
#      (stripped) and /usr/bin/metacontroller, a symbolic link to it (Metacontroller's chart and
#      manifest run that path: started under that name, the hub reads Metacontroller's flags).
#      No shell, no package manager;
#   4. writes an OCI image archive (a tar of an OCI image layout) running /metahook as 65532:65532, for
#      the host's architecture, and next to it an SPDX 2.3 SBOM (<archive without .tar>.spdx.json):
#      the Debian packages with their versions, the binary, and the Rust crates compiled into it.
#
# Reproducible: every file and the image config carry the time SOURCE_DATE_EPOCH (default: the last
# commit's time), entries are sorted and owned by root, so the same binary and packages give the same
# digest, wherever the build runs (tests/image.rs builds twice in two directories and compares).
#
#   deploy/image/build.sh [BINARY] [OUT]
#     BINARY  default target/release/metahook (`make image` builds it first)
#     OUT     default dist/metahook-image.tar
# Env: IMAGE (reference, default ghcr.io/metahook/metahook:<Cargo.toml version>), KEEP_ROOTFS=DIR (also
#      leave the root filesystem there), FORCE=1 (rebuild ocibuild), GO_BUILD_P (default 2),
#      SOURCE_DATE_EPOCH, DEB_CACHE.
# Needs a Debian (or Debian-based) build host: dpkg, apt-get with its package lists (`apt-get update`
# once), and the network for packages not cached yet.
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
SBOM=${OUT%.tar}.spdx.json
VERSION=$(awk -F'"' '/^\[/ { s = $0 } s == "[package]" && /^version *=/ { print $2; exit }' "$ROOT/Cargo.toml")
IMAGE=${IMAGE:-ghcr.io/metahook/metahook:$VERSION}
DEB_CACHE=${DEB_CACHE:-$ROOT/target/image-debs}
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
  SOURCE_DATE_EPOCH=$(git -C "$ROOT" log -1 --format=%ct 2>/dev/null || echo 0)
fi
export SOURCE_DATE_EPOCH

log() { printf '[image] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[ -x "$BINARY" ] || die "no binary at $BINARY (cargo build --release --locked)"
for tool in dpkg dpkg-deb apt-get apt-cache; do
  command -v "$tool" >/dev/null || die "$tool not found: the image is built from Debian packages on a Debian host"
done
ARCH=$(dpkg --print-architecture)
# The image's platform, as OCI (Go's GOARCH) names Debian's architectures.
case $ARCH in
  amd64 | arm64 | s390x | riscv64 | loong64) OCI_ARCH=$ARCH VARIANT= ;;
  armhf) OCI_ARCH=arm VARIANT=v7 ;;
  armel) OCI_ARCH=arm VARIANT=v5 ;;
  i386) OCI_ARCH=386 VARIANT= ;;
  ppc64el) OCI_ARCH=ppc64le VARIANT= ;;
  mips64el) OCI_ARCH=mips64le VARIANT= ;;
  *) die "no OCI name known for Debian architecture $ARCH" ;;
esac

mkdir -p "$BIN"
exec 9>"$BIN/.ocibuild.lock"
flock -w 1800 9 || die "timed out waiting for another ocibuild build"
want=$( (cd "$HERE" && cat go.mod go.sum ./*.go build.sh) | sha256sum | cut -d' ' -f1)
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

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
ROOTFS=$WORK/rootfs
install -d -m 0755 "$ROOTFS"

# ---- which packages ----------------------------------------------------------------------------
# The owner of every library the binary links, as installed on this host (`pkg:arch`: a library of
# another architecture means the binary is not this host's, and the image would not run it).
declare -A wanted=()
for lib in $(ldd "$BINARY" | grep -oE '/[^ ]+\.so[^ ]*'); do
  owner=$(dpkg -S "$lib" 2>/dev/null || dpkg -S "$(readlink -f "$lib")" 2>/dev/null) ||
    die "no Debian package owns $lib, which $BINARY links"
  owner=${owner%%: *}
  case $owner in
    *:"$ARCH") wanted[${owner%:*}]=1 ;;
    *:*) die "$BINARY links $lib of $owner, not of this host's architecture $ARCH" ;;
    *) wanted[$owner]=1 ;;
  esac
done
[ -n "${wanted[libc6]:-}" ] || die "$BINARY does not link glibc (libc6); nothing to build the image on"

# candidate <package>: the version apt would install (its package lists, no network).
candidate() {
  apt-cache policy "$1" | awk '$1 == "Candidate:" { print $2 }'
}
# fetch <package>: the cached .deb of its candidate version for $ARCH, downloaded once.
fetch() {
  local pkg=$1 version file
  version=$(candidate "$pkg")
  [ -n "$version" ] && [ "$version" != "(none)" ] ||
    die "apt knows no version of $pkg (run apt-get update)"
  # apt-get download's own file name: the epoch's ':' is written %3a; arch "all" packages say so.
  file=$(find "$DEB_CACHE" -maxdepth 1 -name "${pkg}_${version//:/%3a}_*.deb" 2>/dev/null | head -1)
  if [ -z "$file" ]; then
    mkdir -p "$DEB_CACHE"
    log "apt-get download $pkg=$version"
    (cd "$DEB_CACHE" && apt-get download -q -o APT::Sandbox::User=root "$pkg=$version" >&2) ||
      die "apt-get download $pkg=$version failed"
    file=$(find "$DEB_CACHE" -maxdepth 1 -name "${pkg}_${version//:/%3a}_*.deb" | head -1)
  fi
  [ -n "$file" ] || die "no .deb for $pkg $version in $DEB_CACHE"
  printf '%s\n' "$file"
}

# The libraries' packages and what they depend on (Depends and Pre-Depends; the first of alternatives).
declare -A debs=()
queue=("${!wanted[@]}")
while [ "${#queue[@]}" -gt 0 ]; do
  pkg=${queue[0]}
  queue=("${queue[@]:1}")
  [ -z "${debs[$pkg]:-}" ] || continue
  debs[$pkg]=$(fetch "$pkg")
  deps=$(dpkg-deb -f "${debs[$pkg]}" Pre-Depends Depends | sed -E 's/^[A-Za-z-]+: //' | tr ',' '\n' |
    sed -E 's/\|.*//; s/\(.*\)//; s/:any//; s/[[:space:]]//g' | grep -v '^$' || true)
  for dep in $deps; do
    [ -n "${debs[$dep]:-}" ] || queue+=("$dep")
  done
done
for pkg in ca-certificates base-files; do
  debs[$pkg]=$(fetch "$pkg")
done

# ---- the root filesystem -----------------------------------------------------------------------
STATUS=$ROOTFS/var/lib/dpkg/status.d
mkdir -p "$WORK/control"
for pkg in $(printf '%s\n' "${!debs[@]}" | LC_ALL=C sort); do
  deb=${debs[$pkg]}
  dpkg-deb -x "$deb" "$ROOTFS"
  install -d -m 0755 "$STATUS"
  rm -rf "$WORK/control/$pkg" && dpkg-deb -e "$deb" "$WORK/control/$pkg"
  # dpkg's status stanza: the control file, with the Status dpkg writes for an installed package.
  awk '{ print } /^Package:/ { print "Status: install ok installed" }' "$WORK/control/$pkg/control" \
    >"$STATUS/$pkg"
  [ -f "$WORK/control/$pkg/md5sums" ] && cp "$WORK/control/$pkg/md5sums" "$STATUS/$pkg.md5sums"
  chmod 0644 "$STATUS/$pkg"*
  log "  $(basename "$deb")"
done
# update-ca-certificates' bundle: every certificate the package ships, in sorted order (as
# /etc/ca-certificates.conf lists them), each ending with a newline.
install -d -m 0755 "$ROOTFS/etc/ssl/certs"
(cd "$ROOTFS/usr/share/ca-certificates" && find . -name '*.crt' | LC_ALL=C sort | sed 's|^\./||') |
  while read -r cert; do
    sed -e '$a\' "$ROOTFS/usr/share/ca-certificates/$cert"
  done >"$ROOTFS/etc/ssl/certs/ca-certificates.crt"
chmod 0644 "$ROOTFS/etc/ssl/certs/ca-certificates.crt"
[ -s "$ROOTFS/etc/ssl/certs/ca-certificates.crt" ] || die "no CA certificates in the ca-certificates package"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
  >"$ROOTFS/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$ROOTFS/etc/group"
chmod 0644 "$ROOTFS/etc/passwd" "$ROOTFS/etc/group"
install -d -m 1777 "$ROOTFS/tmp"
install -m 0755 "$BINARY" "$ROOTFS/metahook"
strip --strip-debug "$ROOTFS/metahook"
# A link, not a copy or a hard link (the layer would hold the binary twice); the name is what counts.
install -d -m 0755 "$ROOTFS/usr/bin"
ln -s /metahook "$ROOTFS/usr/bin/metacontroller"
# Every library the binary links is in the image, at the path ldd resolved it to on this host.
for lib in $(ldd "$BINARY" | grep -oE '/[^ ]+\.so[^ ]*'); do
  [ -e "$ROOTFS$lib" ] || die "$lib, which $BINARY links, is not in the image's packages"
done
if [ -n "${KEEP_ROOTFS:-}" ]; then
  rm -rf "$KEEP_ROOTFS" && mkdir -p "$KEEP_ROOTFS" && cp -a "$ROOTFS/." "$KEEP_ROOTFS/"
fi

# ---- the Rust crates in the binary, for the SBOM -----------------------------------------------
# The normal (not build, not dev, not proc-macro) dependencies of the package, for the binary's target.
CARGO=${CARGO:-cargo}
TRIPLE=$(rustc -vV 2>/dev/null | awk '$1 == "host:" { print $2 }')
(cd "$ROOT" && "$CARGO" tree --locked --offline -q -e normal,no-proc-macro --prefix none \
  ${TRIPLE:+--target "$TRIPLE"} --format '{p}|{l}') |
  awk -F'|' '$1 !~ /\(/ && $0 !~ / \(\*\)$/ { split($1, p, " "); print p[1] "\t" substr(p[2], 2) "\t" $2 }' | LC_ALL=C sort -u \
  >"$WORK/crates.tsv" || die "cargo tree (the crates in the binary, for the SBOM) failed"

mkdir -p "$(dirname "$OUT")"
"$TOOL" -rootfs "$ROOTFS" -out "$OUT" -ref "$IMAGE" -entrypoint /metahook -user 65532:65532 \
  -arch "$OCI_ARCH" ${VARIANT:+-variant "$VARIANT"} \
  -env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
  -label "org.opencontainers.image.title=metahook" \
  -label "org.opencontainers.image.version=$VERSION" \
  -label "org.opencontainers.image.source=https://github.com/metahook/metahook" \
  -sbom "$SBOM" -sbom-binary /metahook -sbom-version "$VERSION" \
  -sbom-crates "$WORK/crates.tsv" -sbom-cargo-lock "$ROOT/Cargo.lock" >&2
log "$IMAGE ($ARCH) -> $OUT ($(du -h "$OUT" | cut -f1), rootfs $(du -sh "$ROOTFS" | cut -f1)), SBOM $SBOM"
