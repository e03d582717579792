#!/usr/bin/env bash
# Refreshes the generated parts of deploy/ from their sources in the repository:
#   crds/*.yaml           -> deploy/kustomize/crds/, deploy/helm/metahook/crds/  (identical copies)
#   config/metahook.yaml  -> deploy/kustomize/config/metahook.yaml               (identical copy)
#                         -> the `config:` block of deploy/helm/metahook/values.yaml (indented)
#   Cargo.toml version    -> kustomization.yaml `newTag`, Chart.yaml `version` and `appVersion`
#   grafana/metahook.json -> helm/metahook/files/metahook-dashboard.json,
#                            kustomize/components/grafana-dashboard/metahook.json      (identical copies)
#   prometheus/metahook.rules.yaml -> helm/metahook/files/metahook.rules.yaml          (identical copy)
#                            -> kustomize/components/prometheus-rule/prometheusrule.yaml (its groups, as the
#                               spec of a PrometheusRule)
# Copies are needed because kustomize refuses files outside the kustomization root and a Helm chart
# must be self-contained.
#
#   deploy/sync.sh          write whatever is stale
#   deploy/sync.sh --check  change nothing; list what is stale and exit 1 if anything is
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
CHECK=0
case ${1:-} in
  --check) CHECK=1 ;;
  "") ;;
  *) echo "usage: deploy/sync.sh [--check]" >&2; exit 2 ;;
esac

KUST=deploy/kustomize
CHART=deploy/helm/metahook
VERSION=$(awk -F'"' '/^\[/ { section = $0 } section == "[package]" && /^version *=/ { print $2; exit }' Cargo.toml)
[ -n "$VERSION" ] || { echo "sync.sh: no [package] version in Cargo.toml" >&2; exit 1; }

stale=0
# put <dest>: make <dest> hold stdin (or, with --check, report whether it does).
put() {
  local dest=$1 tmp
  tmp=$(mktemp)
  cat >"$tmp"
  if cmp -s "$tmp" "$dest"; then
    rm -f "$tmp"
  elif [ "$CHECK" = 1 ]; then
    echo "stale: $dest (run deploy/sync.sh)" >&2
    diff -u "$dest" "$tmp" 2>/dev/null | head -20 >&2 || true
    rm -f "$tmp"
    stale=1
  else
    mkdir -p "$(dirname "$dest")"
    mv -f "$tmp" "$dest"
    chmod 644 "$dest"
    echo "wrote $dest" >&2
  fi
}

# A copy directory must hold exactly the source's *.yaml files, nothing left over.
extra() { # <copy dir>
  local f
  for f in "$1"/*.yaml; do
    [ -e "$f" ] || continue
    [ -e "crds/$(basename "$f")" ] && continue
    if [ "$CHECK" = 1 ]; then
      echo "stale: $f has no source in crds/ (run deploy/sync.sh)" >&2
      stale=1
    else
      rm -f "$f" && echo "removed $f" >&2
    fi
  done
}

for f in crds/*.yaml; do
  put "$KUST/$f" <"$f"
  put "$CHART/$f" <"$f"
  grep -qxF -- "- $f" "$KUST/kustomization.yaml" || {
    echo "stale: $KUST/kustomization.yaml does not list '- $f' under resources (add it by hand)" >&2
    stale=1
  }
done
extra "$KUST/crds"
extra "$CHART/crds"

put "$KUST/config/metahook.yaml" <config/metahook.yaml

sed -E "s/^(  newTag: ).*/\1$VERSION/" "$KUST/kustomization.yaml" | put "$KUST/kustomization.yaml"
sed -E -e "s/^version: .*/version: $VERSION/" -e "s/^appVersion: .*/appVersion: \"$VERSION\"/" \
  "$CHART/Chart.yaml" | put "$CHART/Chart.yaml"

put "$CHART/files/metahook-dashboard.json" <deploy/grafana/metahook.json
put "$KUST/components/grafana-dashboard/metahook.json" <deploy/grafana/metahook.json
put "$CHART/files/metahook.rules.yaml" <deploy/prometheus/metahook.rules.yaml
{
  cat <<'HEAD'
# Generated from deploy/prometheus/metahook.rules.yaml by deploy/sync.sh; edit that file, not this one.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: metahook
  namespace: metahook
  labels:
    app.kubernetes.io/name: metahook
    app.kubernetes.io/instance: metahook
    app.kubernetes.io/part-of: metahook
spec:
HEAD
  # The rule file without its leading comment, indented under spec.
  awk 'body || !/^#/ { body = 1; print ($0 == "" ? "" : "  " $0) }' deploy/prometheus/metahook.rules.yaml
} | put "$KUST/components/prometheus-rule/prometheusrule.yaml"

# values.yaml: replace the lines between the BEGIN/END markers with config/metahook.yaml, indented.
BEGIN='  # BEGIN generated from config/metahook.yaml by deploy/sync.sh; edit that file, not this block.'
END='  # END generated from config/metahook.yaml'
grep -qxF -- "$BEGIN" "$CHART/values.yaml" && grep -qxF -- "$END" "$CHART/values.yaml" || {
  echo "sync.sh: $CHART/values.yaml lacks the config BEGIN/END marker lines" >&2
  exit 1
}
awk -v begin="$BEGIN" -v end="$END" -v src=config/metahook.yaml '
  $0 == begin { print; while ((getline line < src) > 0) print (line == "" ? "" : "  " line); skip = 1; next }
  $0 == end { skip = 0 }
  !skip { print }
' "$CHART/values.yaml" | put "$CHART/values.yaml"

if [ "$stale" = 1 ]; then
  exit 1
fi
[ "$CHECK" = 1 ] && echo "deploy/ is in sync with crds/, config/metahook.yaml and Cargo.toml ($VERSION)" >&2
exit 0
