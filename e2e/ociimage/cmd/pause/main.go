// Command pause is the sandbox ("pause") container of a test cluster: it holds the pod's
// namespaces until it is told to stop. It waits for SIGTERM or SIGINT and exits 0; as
// PID 1 of a pod that shares its process namespace it also reaps orphaned children.
// Build it static (CGO_ENABLED=0).
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Println("pause (nftproxy e2e)")
		return
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			fmt.Fprintf(os.Stderr, "pause: %v, exiting\n", sig)
			os.Exit(0)
		}
		for { // reap every child that has exited
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
