package cluster

import (
	"os"
	"testing"
)

// Require gates e2e tests: without NFTPROXY_E2E=1 the test is skipped (it needs root,
// creates network namespaces and may build kube-apiserver); with it, missing
// prerequisites fail the test instead of skipping it.
func Require(t testing.TB) {
	t.Helper()
	err := CheckPrerequisites()
	if os.Getenv("NFTPROXY_E2E") != "1" {
		if err != nil {
			t.Skipf("skipping e2e test: %v (NFTPROXY_E2E=1 turns this into a failure)", err)
		}
		t.Skip("skipping e2e test: set NFTPROXY_E2E=1 to run it (root; creates network namespaces)")
	}
	if err != nil {
		t.Fatal(err)
	}
}

// StartT calls Require, starts a cluster logging to t and stops it in t.Cleanup. If the
// test failed, the tail of every process log is logged first.
func StartT(t testing.TB, cfg Config) *Cluster {
	t.Helper()
	Require(t)
	if cfg.Logf == nil {
		cfg.Logf = t.Logf
	}
	c, err := Start(t.Context(), cfg)
	if err != nil {
		t.Fatalf("start cluster: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			c.mu.Lock()
			procs := append([]*Process(nil), c.procs...)
			c.mu.Unlock()
			for _, p := range procs {
				t.Logf("--- tail of %s:\n%s", p.Log, p.Tail(30))
			}
		}
		c.Stop()
	})
	return c
}
