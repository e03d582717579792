#!/usr/bin/env bash
# Checks the cluster add-on in deploy/ for real:
#   1. the generated copies are fresh: deploy/sync.sh --check (CRD copies byte-identical to crds/,
#      config copy and values.yaml `config:` block = config/metahook.yaml, versions = Cargo.toml);
#   2. builds helm from the Go module proxy if needed (deploy/helm/tools/build.sh, stamp-cached);
#   3. renders the kustomization (`kubectl kustomize`) and the chart (`helm lint --strict`,
#      `helm template --include-crds`, default values and ci/overrides-values.yaml; the kustomize
#      component cluster-admin-like; every optional piece in both: the components service-monitor,
#      prometheus-rule, grafana-dashboard, network-policy and the chart values that add the same objects),
#      checks the image is <repo>:<Cargo.toml version>, that both ship the leader election (2 replicas,
#      --leader-elect, a PodDisruptionBudget, a metrics Service), that the optional objects render only
#      when asked for, and that the chart refuses an unknown rbac.mode and unknown config keys;
#   4. applies every rendering to the cluster with `kubectl apply --dry-run=server` (server-side
#      validation of every object, strict field validation; nothing is created).
# Namespaced objects are dry-run in namespace `default` (DRYRUN_NAMESPACE): a dry-run does not create
# the `metahook` Namespace, so objects inside it would be rejected with "namespace not found". The
# kustomization is retargeted by a throwaway overlay (`namespace: default`), the chart by --namespace.
#
# Env: KUBECONFIG (default <repo>/.cluster/kubeconfig; start it with `make cluster-up`),
#      VERIFY_OUT (directory for the renderings; default a temp dir, removed at the end),
#      DRYRUN_NAMESPACE (default `default`), SKIP_CLUSTER=1 (stop after step 3).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BIN=$ROOT/tests/cluster/bin
KUBECTL=$BIN/kubectl
HELM=$BIN/helm
CHART=deploy/helm/metahook
NS=${DRYRUN_NAMESPACE:-default}
export KUBECONFIG=${KUBECONFIG:-$ROOT/.cluster/kubeconfig}

step() { printf '[verify] %s\n' "$*" >&2; }
die() { printf '[verify] FAILED: %s\n' "$*" >&2; exit 1; }

if [ -n "${VERIFY_OUT:-}" ]; then
  OUT=$VERIFY_OUT
  mkdir -p "$OUT"
else
  OUT=$(mktemp -d)
  trap 'rm -rf "$OUT"' EXIT
fi
# Keep helm's cache/config/data out of $HOME.
export HELM_CACHE_HOME=$OUT/.helm/cache HELM_CONFIG_HOME=$OUT/.helm/config HELM_DATA_HOME=$OUT/.helm/data

VERSION=$(awk -F'"' '/^\[/ { s = $0 } s == "[package]" && /^version *=/ { print $2; exit }' Cargo.toml)
IMAGE=ghcr.io/metahook/metahook:$VERSION

step "1/4 generated copies are fresh (deploy/sync.sh --check)"
deploy/sync.sh --check || die "deploy/ is stale; run deploy/sync.sh and commit the result"

step "2/4 helm binary"
[ -x "$KUBECTL" ] || die "$KUBECTL missing; run 'make cluster-build'"
deploy/helm/tools/build.sh || die "building helm failed (deploy/helm/tools/build.sh)"
"$HELM" version --short >&2

step "3/4 rendering"
"$KUBECTL" kustomize deploy/kustomize >"$OUT/kustomize.yaml" || die "kubectl kustomize deploy/kustomize"
# The same kustomization with its namespaced objects moved to $NS, for the dry-run.
mkdir -p "$OUT/overlay"
printf 'apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- %s\nnamespace: %s\n' \
  "$(realpath --relative-to="$OUT/overlay" deploy/kustomize)" "$NS" >"$OUT/overlay/kustomization.yaml"
"$KUBECTL" kustomize "$OUT/overlay" >"$OUT/kustomize-dryrun.yaml" || die "kubectl kustomize (dry-run overlay)"
# rbac.mode cluster-admin-like for kustomize: the component in an overlay.
mkdir -p "$OUT/overlay-admin"
printf 'apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- %s\ncomponents:\n- %s\nnamespace: %s\n' \
  "$(realpath --relative-to="$OUT/overlay-admin" deploy/kustomize)" \
  "$(realpath --relative-to="$OUT/overlay-admin" deploy/kustomize/components/cluster-admin-like)" "$NS" \
  >"$OUT/overlay-admin/kustomization.yaml"
"$KUBECTL" kustomize "$OUT/overlay-admin" >"$OUT/kustomize-admin-dryrun.yaml" || die "kubectl kustomize (cluster-admin-like)"
grep -q '^  name: metahook-cluster-admin-like$' "$OUT/kustomize-admin-dryrun.yaml" ||
  die "the cluster-admin-like component does not add its ClusterRole"

# Every optional piece, in both: the kustomize components and the chart values that add the same objects
# (ServiceMonitor, PrometheusRule, Grafana dashboard ConfigMap, NetworkPolicy). tests/deploy.rs compares
# the two renderings object by object.
COMPONENTS="service-monitor prometheus-rule grafana-dashboard network-policy"
ALL_VALUES=metrics.serviceMonitor.enabled=true,metrics.prometheusRule.enabled=true,metrics.grafanaDashboard.enabled=true,networkPolicy.enabled=true
overlay() { # <dir> <namespace or ""> <component...>: an overlay of the base with those components
  local dir=$1 ns=$2 c
  shift 2
  mkdir -p "$dir"
  {
    printf 'apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- %s\ncomponents:\n' \
      "$(realpath --relative-to="$dir" deploy/kustomize)"
    for c in "$@"; do printf -- '- %s\n' "$(realpath --relative-to="$dir" "deploy/kustomize/components/$c")"; done
    [ -z "$ns" ] || printf 'namespace: %s\n' "$ns"
  } >"$dir/kustomization.yaml"
}
# shellcheck disable=SC2086
overlay "$OUT/overlay-all" "" $COMPONENTS
"$KUBECTL" kustomize "$OUT/overlay-all" >"$OUT/kustomize-all.yaml" || die "kubectl kustomize (every component)"
# The components whose objects the API server knows without the Prometheus Operator's CRDs, for the dry-run.
overlay "$OUT/overlay-optional" "$NS" grafana-dashboard network-policy
"$KUBECTL" kustomize "$OUT/overlay-optional" >"$OUT/kustomize-optional-dryrun.yaml" ||
  die "kubectl kustomize (grafana-dashboard, network-policy)"

"$HELM" lint --strict "$CHART" >&2 || die "helm lint --strict $CHART"
"$HELM" lint --strict "$CHART" -f "$CHART/ci/overrides-values.yaml" >&2 ||
  die "helm lint --strict $CHART -f ci/overrides-values.yaml"
"$HELM" template metahook "$CHART" --namespace metahook --include-crds >"$OUT/helm-default.yaml" ||
  die "helm template (default values)"
"$HELM" template metahook "$CHART" --namespace "$NS" --include-crds >"$OUT/helm-default-dryrun.yaml" ||
  die "helm template (default values, namespace $NS)"
"$HELM" template metahook "$CHART" --namespace "$NS" --include-crds -f "$CHART/ci/overrides-values.yaml" \
  >"$OUT/helm-overrides.yaml" || die "helm template -f ci/overrides-values.yaml"

for f in kustomize.yaml helm-default.yaml; do
  grep -qE "^ +image: \"?$IMAGE\"?\$" "$OUT/$f" || die "$f: Deployment image is not $IMAGE"
done
for f in kustomize.yaml helm-default.yaml; do
  n=$(grep -c '^kind: CustomResourceDefinition$' "$OUT/$f" || true)
  [ "$n" = "$(ls crds/*.yaml | wc -l)" ] || die "$f has $n CRDs, crds/ has $(ls crds/*.yaml | wc -l)"
  for kind in PodDisruptionBudget Service Role RoleBinding; do
    grep -q "^kind: $kind\$" "$OUT/$f" || die "$f has no $kind"
  done
  grep -q -- '--leader-elect' "$OUT/$f" || die "$f: the hub does not run with --leader-elect"
  grep -q '^  replicas: 2$' "$OUT/$f" || die "$f: not 2 replicas"
done
# The ServiceMonitor, PrometheusRule, dashboard and NetworkPolicy are opt-in (the first two need the
# Prometheus Operator's CRDs, so they are rendered, not dry-run).
"$HELM" template metahook "$CHART" --namespace metahook --include-crds --set "$ALL_VALUES" \
  >"$OUT/helm-all.yaml" || die "helm template --set $ALL_VALUES"
for kind in ServiceMonitor PrometheusRule NetworkPolicy; do
  grep -q "^kind: $kind\$" "$OUT/helm-all.yaml" || die "$ALL_VALUES renders no $kind"
  ! grep -q "^kind: $kind\$" "$OUT/helm-default.yaml" "$OUT/kustomize.yaml" || die "the $kind must be opt-in"
done
grep -q '^  name: metahook-grafana-dashboard$' "$OUT/helm-all.yaml" || die "no Grafana dashboard ConfigMap"
! grep -q 'grafana-dashboard$' "$OUT/helm-default.yaml" "$OUT/kustomize.yaml" || die "the dashboard must be opt-in"

# The guards must hold: these renderings have to fail, with the intended message.
expect_fail() { # <what> <grep pattern> <helm template args...>
  local what=$1 pattern=$2 err
  shift 2
  if err=$("$HELM" template metahook "$CHART" "$@" 2>&1 >/dev/null); then
    die "helm template $* succeeded, but $what must be refused"
  fi
  grep -qE "$pattern" <<<"$err" || die "helm template $*: refused $what, but not as expected: $err"
}
expect_fail "an unknown rbac.mode" "rbac.mode|mode" --set rbac.mode=everything
expect_fail "an unknown config key" "additional properties 'noSuchKey' not allowed|noSuchKey" --set config.noSuchKey=1
expect_fail "a string for config.workers" "workers" --set-string config.workers=five
step "renderings in $OUT: $(cd "$OUT" && ls ./*.yaml | tr '\n' ' ')"

if [ "${SKIP_CLUSTER:-0}" = 1 ]; then
  step "4/4 skipped (SKIP_CLUSTER=1)"
  exit 0
fi
step "4/4 server-side dry-run against $("$KUBECTL" config view --minify -o jsonpath='{.clusters[0].cluster.server}')"
[ -s "$KUBECONFIG" ] || die "no kubeconfig at $KUBECONFIG; run 'make cluster-up'"
for f in kustomize-dryrun.yaml kustomize-admin-dryrun.yaml kustomize-optional-dryrun.yaml helm-default-dryrun.yaml \
  helm-overrides.yaml; do
  step "  kubectl apply --dry-run=server -f $f"
  "$KUBECTL" apply --dry-run=server -f "$OUT/$f" >"$OUT/$f.applied" 2>&1 || {
    cat "$OUT/$f.applied" >&2
    die "the API server rejected $f"
  }
  sed 's/^/    /' "$OUT/$f.applied" >&2
done
step "OK: kustomization and chart render, and the API server accepts every object"
