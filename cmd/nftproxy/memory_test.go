package main

import (
	"fmt"
	"runtime/debug"
	"testing"
)

// gcPercent reads the runtime's GOGC setting.
func gcPercent() int {
	p := debug.SetGCPercent(-1)
	debug.SetGCPercent(p)
	return p
}

func TestMemoryPolicyPhases(t *testing.T) {
	orig := gcPercent()
	t.Cleanup(func() { debug.SetGCPercent(orig) })
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }

	debug.SetGCPercent(77)
	env["GOGC"] = "77"
	if m := startMemoryPolicy(getenv); m != nil {
		t.Fatal("GOGC is set: want no policy")
	}
	if p := gcPercent(); p != 77 {
		t.Errorf("GOGC is set: the policy changed it to %d", p)
	}
	delete(env, "GOGC")

	env["GOMEMLIMIT"] = "1GiB"
	if m := startMemoryPolicy(getenv); m == nil || m.ballast != nil {
		t.Errorf("GOMEMLIMIT is set: want the policy without a ballast, got %s", describe(m))
	}
	delete(env, "GOMEMLIMIT")

	m := startMemoryPolicy(getenv)
	if m == nil || len(m.ballast) != listBallastSize {
		t.Fatalf("want the policy with a %d-byte ballast, got %s", listBallastSize, describe(m))
	}
	if p := gcPercent(); p != coldGCPercent {
		t.Errorf("while the informers list: GOGC=%d, want %d", p, coldGCPercent)
	}
	m.cachesSynced()
	if m.ballast != nil {
		t.Error("the ballast outlives the lists")
	}
	if p := gcPercent(); p != firstSyncGCPercent {
		t.Errorf("during the first sync: GOGC=%d, want %d", p, firstSyncGCPercent)
	}
	m.firstSyncDone()
	if p := gcPercent(); p != steadyGCPercent {
		t.Errorf("after the first sync: GOGC=%d, want %d", p, steadyGCPercent)
	}
}

// describe says what a policy holds (printing it would print the ballast's bytes).
func describe(m *memoryPolicy) string {
	if m == nil {
		return "no policy"
	}
	return fmt.Sprintf("a policy with a %d-byte ballast", len(m.ballast))
}
