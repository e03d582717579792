//go:build tools

// Package tools pins CoreDNS, the real node's cluster DNS (the kube-dns Service), so that `service:`
// hook references and every other cluster.local name resolve in Pods as in any cluster. Its own module
// because CoreDNS's go.mod carries its own k8s.io versions.
package tools

import (
	_ "github.com/coredns/coredns"
)
