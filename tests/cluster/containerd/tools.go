//go:build tools

// Package tools pins containerd 2.x, the container runtime of the real node (tests/cluster/node-up.sh):
// the daemon, its runc shim (without which no container starts) and ctr (to import local images).
// Its own module because containerd's go.mod carries its own k8s.io versions. Kubernetes 1.36 supports
// no containerd 1.x, which is what Debian ships.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
