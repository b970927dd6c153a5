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
	RequireFor(t, CheckPrerequisites, "root; creates network namespaces")
}

// RequireFor is Require for a harness with other prerequisites: check reports what is
// missing, needs says what the tests need (for the skip message).
func RequireFor(t testing.TB, check func() error, needs string) {
	t.Helper()
	err := check()
	if os.Getenv("NFTPROXY_E2E") != "1" {
		if err != nil {
			t.Skipf("skipping e2e test: %v (NFTPROXY_E2E=1 turns this into a failure)", err)
		}
		t.Skipf("skipping e2e test: set NFTPROXY_E2E=1 to run it (%s)", needs)
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
	return Started(t, func() (*Cluster, error) {
		if cfg.Logf == nil {
			cfg.Logf = t.Logf
		}
		return Start(t.Context(), cfg)
	})
}

// Stopper is a started cluster of this package or of e2e/realcluster.
type Stopper interface {
	Stop()
	Tails(n int) string // the last n lines of every process log
}

// Started runs start, fails t if it fails, and stops the cluster in t.Cleanup, logging
// the tail of every process log first if the test failed.
func Started[C Stopper](t testing.TB, start func() (C, error)) C {
	t.Helper()
	c, err := start()
	if err != nil {
		t.Fatalf("start cluster: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(c.Tails(40))
		}
		c.Stop()
	})
	return c
}
