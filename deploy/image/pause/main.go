// Command pause is the sandbox ("pause") container of a Pod, as registry.k8s.io/pause runs it: it
// holds the Pod's namespaces open, doing nothing, until it is told to stop. As PID 1 of the Pod's
// PID namespace (shareProcessNamespace) it also reaps the orphans that are re-parented to it.
//
// deploy/image/node-images.sh builds it statically (CGO_ENABLED=0) into the image pause.tar
// (registry.k8s.io/pause:3.10 in the local registry), because nothing can be pulled where the local
// test node runs. It exits 0 on SIGTERM or SIGINT, reaps every exited child on SIGCHLD, and prints
// its version with -v, as the real pause does.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

const version = "3.10 (metahook deploy/image/pause)"

func main() {
	if len(os.Args) == 2 && os.Args[1] == "-v" {
		fmt.Println("pause.go", version)
		return
	}
	if len(os.Args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: pause [-v]")
		os.Exit(1)
	}
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "Warning: pause should be the first process")
	}
	signals := make(chan os.Signal, 16)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range signals {
		switch sig {
		case syscall.SIGCHLD:
			reap()
		default:
			fmt.Fprintf(os.Stderr, "Shutting down, got signal: %v\n", sig)
			os.Exit(0)
		}
	}
}

// reap collects every child that has exited (one SIGCHLD may stand for several).
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
	}
}
