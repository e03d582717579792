//go:build tools

// Package tools pins the helm CLI that deploy/verify.sh builds (into tests/cluster/bin/helm)
// to render and lint the chart. Nothing here is shipped; it only exists so `go build` resolves
// helm.sh/helm/v3/cmd/helm at the version go.mod requires.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
