//go:build tools

// Package tools pins sigs.k8s.io/kwok, whose cmd/kwok simulates Nodes and Pods (no kubelet needed).
// It lives in its own module because kwok's go.mod carries its own k8s.io versions.
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
