package realcluster

import (
	"testing"

	"github.com/nftproxy/nftproxy/e2e/cluster"
)

// Require gates the real-cluster tests: skipped without NFTPROXY_E2E=1 (they need root,
// create namespaces, cgroups and containers); with it, missing prerequisites fail them.
func Require(t testing.TB) {
	t.Helper()
	cluster.RequireFor(t, CheckPrerequisites, "root; namespaces, containerd, kubelet")
}

// StartT checks prerequisites, skips unless NFTPROXY_E2E=1, starts a cluster logging to t
// and tears it down in t.Cleanup (logging every process's tail first if the test failed).
func StartT(t testing.TB, cfg Config) *Cluster {
	t.Helper()
	Require(t)
	return cluster.Started(t, func() (*Cluster, error) {
		if cfg.Logf == nil {
			cfg.Logf = t.Logf
		}
		return Start(t.Context(), cfg)
	})
}
