#!/bin/sh
# Makes the certificates of the mtls example with openssl, into DIR (default: ./certs):
#   ca.crt, ca.key        a CA that signs both certificates below (keep its key somewhere safe)
#   hook.crt, hook.key    the hook's server certificate: 127.0.0.1, localhost and the in-cluster
#                         Service name mtls-notes.hooks.svc
#   hub.crt, hub.key      the hub's client certificate, which the hook requires
# One CA for both directions keeps the example short; two CAs work the same way.
# Usage: ./make-certs.sh [DIR]   (DAYS=365 by default)
set -eu
dir=${1:-certs}
days=${DAYS:-365}
mkdir -p "$dir"
cd "$dir"

openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -keyout ca.key -out ca.crt \
  -days "$days" -subj "/CN=mtls-notes example CA" -config /dev/null \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -addext "subjectKeyIdentifier=hash"

# leaf NAME EXTENDED_KEY_USAGE [EXTRA_EXTENSION_LINE]: NAME.crt and NAME.key, signed by the CA.
leaf() {
  openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -keyout "$1.key" -out "$1.csr" \
    -subj "/CN=$1" -config /dev/null
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature"
    echo "extendedKeyUsage=$2"
    echo "subjectKeyIdentifier=hash"
    echo "authorityKeyIdentifier=keyid,issuer"
    if [ $# -gt 2 ]; then echo "$3"; fi
  } >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days "$days" -extfile "$1.ext" \
    -out "$1.crt"
  rm "$1.csr" "$1.ext"
}

leaf hook serverAuth "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:mtls-notes.hooks.svc"
leaf hub clientAuth
echo "made ca, hook and hub certificates in $dir" >&2
