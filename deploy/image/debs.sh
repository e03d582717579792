# shellcheck shell=bash
# Shell functions that lay out an image's root filesystem from Debian packages, without a container
# engine and without running any package's maintainer scripts. Sourced (not run) by
# deploy/image/node-images.sh; written so deploy/image/build.sh can share them.
#
# The caller sets DEB_CACHE (where .debs are kept: one download per package, version and
# architecture), ARCH (`dpkg --print-architecture`), and defines log and die. The functions:
#   deb_candidate PKG          the version apt would install (its package lists; no network)
#   deb_resolve PKG            PKG, or for a virtual package (libgcc1) the real package providing it
#   deb_closure ARRAY ROOT...  fills the associative ARRAY (name -> version) with the ROOT packages and
#                              what they need (Depends + Pre-Depends, first of alternatives), from apt's
#                              records alone (nothing is downloaded; a stamp can be made of it). Names
#                              in the associative array DEB_SKIP are left out, with what only they need;
#                              names in DEB_NODEPS are put in without what they depend on (their
#                              dependencies serve maintainer scripts that never run in an image)
#   deb_fetch PKG VERSION      the cached .deb, downloaded once with `apt-get download`; when no
#                              configured repository has that version any more but it is installed
#                              on this host, repacked from the host's files (deb_repack)
#   deb_unpack ROOTFS DEB...   `dpkg-deb -x` each, and its dpkg status as distroless keeps it:
#                              /var/lib/dpkg/status.d/<pkg> (control + "Status: install ok installed")
#                              and status.d/<pkg>.md5sums, so image scanners see what is inside
#   deb_ca_bundle ROOTFS       /etc/ssl/certs/ca-certificates.crt as update-ca-certificates makes it
#   deb_accounts ROOTFS        /etc/passwd and /etc/group (root, nonroot 65532, nobody 65534), /tmp 1777
#   deb_slim ROOTFS            drops documentation: /usr/share/{doc,man,info,locale,lintian}

# deb_candidate PKG
deb_candidate() {
  apt-cache policy "$1" 2>/dev/null | awk '$1 == "Candidate:" { print $2 }'
}

# deb_resolve PKG: a package apt can install, or the first real package providing the virtual PKG.
deb_resolve() {
  local pkg=$1 version provider
  version=$(deb_candidate "$pkg")
  if [ -n "$version" ] && [ "$version" != "(none)" ]; then
    printf '%s\n' "$pkg"
    return
  fi
  provider=$(apt-cache showpkg "$pkg" 2>/dev/null |
    awk '/^Reverse Provides:/ { f = 1; next } f && NF && $1 !~ /:/ { print $1; exit }')
  [ -n "$provider" ] || die "apt knows no version of $pkg and no package providing it (run apt-get update)"
  printf '%s\n' "$provider"
}

# deb_depends PKG=VERSION...: "PKG DEPENDENCY" lines, for what each needs (Pre-Depends, Depends; the
# first of alternatives), from one apt-cache call.
deb_depends() {
  [ "$#" -gt 0 ] || return 0
  apt-cache show "$@" 2>/dev/null | awk '
    /^Package:/ { pkg = $2 }
    /^(Pre-Depends|Depends):/ {
      sub(/^[A-Za-z-]+: /, "")
      n = split($0, deps, ",")
      for (i = 1; i <= n; i++) {
        d = deps[i]; sub(/\|.*/, "", d); sub(/\(.*/, "", d); sub(/:any/, "", d); gsub(/[[:space:]]/, "", d)
        if (d != "") print pkg, d
      }
    }' | LC_ALL=C sort -u
}

# deb_closure ARRAY ROOT...: ARRAY[name]=version for ROOT and its dependency closure, minus DEB_SKIP.
# Breadth first, one level at a time (an apt-cache call takes about half a second).
deb_closure() {
  local -n _out=$1
  shift
  local level=("$@") names pkg dep real version
  local -A cand
  while [ "${#level[@]}" -gt 0 ]; do
    names=()
    for pkg in "${level[@]}"; do
      if [ -z "${DEB_SKIP[$pkg]:-}" ] && [ -z "${_out[$pkg]:-}" ]; then names+=("$pkg"); fi
    done
    level=()
    [ "${#names[@]}" -gt 0 ] || break
    cand=()
    while read -r pkg version; do cand[$pkg]=$version; done < <(apt-cache policy "${names[@]}" 2>/dev/null |
      awk '/^[^ ]/ { name = $1; sub(/:$/, "", name) } $1 == "Candidate:" { print name, $2 }')
    local added=()
    for pkg in $(printf '%s\n' "${names[@]}" | LC_ALL=C sort -u); do
      real=$pkg version=${cand[$pkg]:-}
      if [ -z "$version" ] || [ "$version" = "(none)" ]; then # a virtual package
        real=$(deb_resolve "$pkg") || exit 1
        version=$(deb_candidate "$real")
      fi
      [ -z "${DEB_SKIP[$real]:-}" ] && [ -z "${_out[$real]:-}" ] || continue
      _out[$real]=$version
      [ -n "${DEB_NODEPS[$real]:-}" ] || added+=("$real=$version")
    done
    while read -r pkg dep; do
      [ -n "${_out[$dep]:-}" ] || level+=("$dep")
    done < <(deb_depends "${added[@]}")
  done
}

# deb_file PKG VERSION: the cached .deb, or nothing. apt-get download's own file name: the epoch's
# ':' is written %3a; "all" packages say so.
deb_file() {
  find "$DEB_CACHE" -maxdepth 1 -name "${1}_${2//:/%3a}_*.deb" 2>/dev/null | LC_ALL=C sort | head -1
}

# deb_fetch PKG VERSION: the cached .deb of PKG=VERSION for $ARCH, downloaded once.
deb_fetch() {
  local pkg=$1 version=$2 file
  file=$(deb_file "$pkg" "$version")
  if [ -z "$file" ]; then
    mkdir -p "$DEB_CACHE"
    log "apt-get download $pkg=$version"
    if ! (cd "$DEB_CACHE" && apt-get download -q -o APT::Sandbox::User=root "$pkg=$version" >&2); then
      [ "$(dpkg-query -W -f '${Version}' "$pkg" 2>/dev/null)" = "$version" ] ||
        die "apt-get download $pkg=$version failed, and that version is not installed here to repack"
      deb_repack "$pkg" "$version"
    fi
    file=$(deb_file "$pkg" "$version")
  fi
  [ -n "$file" ] || die "no .deb for $pkg $version in $DEB_CACHE"
  printf '%s\n' "$file"
}

# deb_repack PKG VERSION: a .deb of PKG as installed on this host (when its repository is gone),
# named <pkg>_<version>_<arch>.repack.deb: the files that still match the package's md5sums (a file
# changed or removed on the host since is left out, and said so), its control stanza from dpkg's
# status, its md5sums reduced to the files kept.
deb_repack() {
  local pkg=$1 version=$2 dir arch out kept=0 dropped=0 sum path
  arch=$(dpkg-query -W -f '${Architecture}' "$pkg")
  out=$DEB_CACHE/${pkg}_${version//:/%3a}_${arch}.repack.deb
  log "repacking $pkg=$version from this host's installed files (no repository offers it)"
  dir=$(mktemp -d)
  chmod 0755 "$dir" # the archive's ./, which dpkg-deb -x gives the directory it unpacks into
  install -d -m 0755 "$dir/DEBIAN"
  dpkg-query -s "$pkg" | grep -v -E '^(Status|Config-Version):' >"$dir/DEBIAN/control"
  : >"$dir/DEBIAN/md5sums"
  while read -r sum path; do
    if [ -f "/$path" ] && [ ! -L "/$path" ] && [ "$(md5sum <"/$path" | cut -d' ' -f1)" = "$sum" ]; then
      install -D -m "$(stat -c %a "/$path")" "/$path" "$dir/$path"
      printf '%s  %s\n' "$sum" "$path" >>"$dir/DEBIAN/md5sums"
      kept=$((kept + 1))
    else
      dropped=$((dropped + 1))
    fi
  done <"/var/lib/dpkg/info/$pkg.md5sums"
  # Symbolic links (md5sums lists regular files only), as the package installed them.
  dpkg -L "$pkg" | while read -r path; do
    if [ -L "$path" ] && [ ! -e "$dir$path" ]; then
      install -d "$dir$(dirname "$path")" && cp -P "$path" "$dir$path"
    fi
  done
  [ "$kept" -gt 0 ] || die "no file of $pkg on this host matches its md5sums; nothing to repack"
  dpkg-deb --root-owner-group -Zgzip -z1 -b "$dir" "$out.tmp" >/dev/null || die "dpkg-deb -b $pkg failed"
  mv -f "$out.tmp" "$out"
  rm -rf "$dir"
  log "  $(basename "$out"): $kept files kept, $dropped changed or missing on this host left out"
}

# deb_unpack ROOTFS DEB...: each package unpacked whole, with its dpkg status in status.d.
deb_unpack() {
  local rootfs=$1 deb pkg control status
  shift
  status=$rootfs/var/lib/dpkg/status.d
  control=$(mktemp -d)
  install -d -m 0755 "$status"
  for deb in "$@"; do
    pkg=$(dpkg-deb -f "$deb" Package)
    dpkg-deb -x "$deb" "$rootfs" || die "dpkg-deb -x $deb failed"
    rm -rf "${control:?}/$pkg" && dpkg-deb -e "$deb" "$control/$pkg"
    awk '{ print } /^Package:/ { print "Status: install ok installed" }' "$control/$pkg/control" >"$status/$pkg"
    if [ -f "$control/$pkg/md5sums" ]; then cp "$control/$pkg/md5sums" "$status/$pkg.md5sums"; fi
    chmod 0644 "$status/$pkg"*
  done
  rm -rf "$control"
}

# deb_ca_bundle ROOTFS: every certificate ca-certificates ships, in sorted order (as
# /etc/ca-certificates.conf lists them), each ending with a newline.
deb_ca_bundle() {
  local rootfs=$1 cert
  [ -d "$rootfs/usr/share/ca-certificates" ] || die "no /usr/share/ca-certificates in $rootfs (unpack ca-certificates first)"
  install -d -m 0755 "$rootfs/etc/ssl/certs"
  (cd "$rootfs/usr/share/ca-certificates" && find . -name '*.crt' | LC_ALL=C sort | sed 's|^\./||') |
    while read -r cert; do
      sed -e '$a\' "$rootfs/usr/share/ca-certificates/$cert"
    done >"$rootfs/etc/ssl/certs/ca-certificates.crt"
  chmod 0644 "$rootfs/etc/ssl/certs/ca-certificates.crt"
  [ -s "$rootfs/etc/ssl/certs/ca-certificates.crt" ] || die "no CA certificates in the ca-certificates package"
}

# deb_accounts ROOTFS: root, the non-root user 65532 ("nonroot", as distroless) and nobody/nogroup
# 65534 (Debian's; the examples' Deployments run as 65534), and /tmp.
deb_accounts() {
  local rootfs=$1
  install -d -m 0755 "$rootfs/etc"
  printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' \
    'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' \
    'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' >"$rootfs/etc/passwd"
  printf '%s\n' 'root:x:0:' 'nonroot:x:65532:' 'nogroup:x:65534:' >"$rootfs/etc/group"
  chmod 0644 "$rootfs/etc/passwd" "$rootfs/etc/group"
  install -d -m 1777 "$rootfs/tmp"
}

# deb_slim ROOTFS: no documentation, manual pages or translations (as distroless; the status.d
# md5sums still list those files).
deb_slim() {
  local rootfs=$1 d
  for d in doc man info locale lintian; do
    rm -rf "${rootfs:?}/usr/share/$d"
  done
}
