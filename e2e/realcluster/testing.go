package realcluster

import (
	"os"
	"testing"
)

// Require gates the real-cluster tests: skipped without NFTPROXY_E2E=1 (they need root,
// create namespaces, cgroups and containers); with it, missing prerequisites fail them.
func Require(t testing.TB) {
	t.Helper()
	err := CheckPrerequisites()
	if os.Getenv("NFTPROXY_E2E") != "1" {
		t.Skip("skipping real-cluster test: set NFTPROXY_E2E=1 to run it (root; namespaces, containerd, kubelet)")
	}
	if err != nil {
		t.Fatal(err)
	}
}
