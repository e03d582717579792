#!/usr/bin/env bash
# Test certificates for the hook-transport tests and benchmark, made in the current directory:
# ca, wrong-ca (signs nothing) and client-ca; server (127.0.0.1, localhost) and greeter (greeter.hooks
# only), signed by ca; client, signed by client-ca; v1-client, signed by client-ca the way Metacontroller's
# webhook-auth example signs its client certificate. EC P-256, valid two days. Never committed.
set -euo pipefail
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key"; }
ca() {
  key "$1"
  openssl req -x509 -new -key "$1.key" -out "$1.crt" -days 2 -subj "/CN=$1" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
}
leaf() {
  key "$1"
  openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$1"
  printf 'subjectAltName=%s\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=%s\n' "$3" "$4" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.crt" -CAkey "$2.key" -set_serial "0x$(openssl rand -hex 8)" \
    -out "$1.crt" -days 2 -extfile "$1.ext"
}
ca ca; ca wrong-ca; ca client-ca
leaf server ca "IP:127.0.0.1,DNS:localhost" serverAuth
leaf greeter ca "DNS:greeter.hooks" serverAuth
leaf client client-ca "DNS:metahook-client" clientAuth
# `openssl x509 -req` without -extfile: OpenSSL 3.0 makes an X.509 v1 certificate, no extensions at all.
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -keyout v1-client.key -out v1-client.csr -nodes \
  -subj "/CN=metacontroller"
openssl x509 -req -in v1-client.csr -CA client-ca.crt -CAkey client-ca.key -CAcreateserial -out v1-client.crt \
  -days 2
