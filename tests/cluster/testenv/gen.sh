#!/usr/bin/env bash
# Regenerates go.mod: pins k8s.io/kubernetes and points every staging module at its published tag.
set -euo pipefail
K8S=${K8S:-v1.36.3}; STG=v0.${K8S#v1.}; ETCD=${ETCD:-v3.6.16}
cd "$(dirname "$0")"
rm -f go.mod go.sum
go mod init metahook.invalid/testenv >/dev/null 2>&1
KMOD=$(cd /tmp && go mod download -json "k8s.io/kubernetes@$K8S" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
go mod edit -go="$(sed -n 's/^go //p' "$KMOD")"
for m in $(sed -n 's|^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/src/.*|\1|p' "$KMOD"); do
  go mod edit -replace "$m=$m@$STG"
done
go mod edit -require "k8s.io/kubernetes@$K8S" -require "go.etcd.io/etcd/server/v3@$ETCD"
go mod tidy
