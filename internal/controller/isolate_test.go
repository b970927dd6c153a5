package controller

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestRefusedServiceIsIsolated: the kernel refuses whatever contains endpoint
// 10.244.9.9. A change that adds it to service "bad" together with a change to service
// "a" must still program "a" (bad's port is found by bisection and kept as it was); later
// syncs do not search again while "bad" is unchanged; a fixed "bad" is programmed.
func TestRefusedServiceIsIsolated(t *testing.T) {
	dp := &fakeDataplane{refuse: func(text string) bool { return strings.Contains(text, "10.244.9.9") }}
	client, _ := startProxy(t, dp,
		service("a", "10.96.0.1"), slice("a", "a-1", "10.244.1.2"),
		service("b", "10.96.0.2"), slice("b", "b-1", "10.244.1.3"),
		service("bad", "10.96.0.3"), slice("bad", "bad-1", "10.244.1.4"))
	waitFor(t, "first sync", func() bool { return strings.Contains(dp.last(), "10.244.1.4 . 8080") })
	ctx := context.Background()
	put := func(svc, name string, addrs ...string) {
		t.Helper()
		if _, err := client.DiscoveryV1().EndpointSlices("default").Update(ctx, slice(svc, name, addrs...), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	put("bad", "bad-1", "10.244.1.4", "10.244.9.9")
	put("a", "a-1", "10.244.1.2", "10.244.1.5")
	waitFor(t, "a's new endpoint programmed despite bad's refused one", func() bool {
		return strings.Contains(dp.last(), "10.244.1.5 . 8080")
	})
	out := dp.last()
	if strings.Contains(out, "10.244.9.9") || !strings.Contains(out, "10.244.1.4 . 8080") || !strings.Contains(out, "10.244.1.3 . 8080") {
		t.Fatalf("after isolation, want bad as it was (10.244.1.4 only) and b intact:\n%s", out)
	}
	waitFor(t, "a warning event on the refused service", func() bool {
		evs, err := client.CoreV1().Events("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == "bad" && e.Reason == "NftproxyRefused" {
				return true
			}
		}
		return false
	})

	// A change elsewhere is one Apply: the quarantined part is not tried again.
	dp.mu.Lock()
	before := dp.calls
	dp.mu.Unlock()
	put("b", "b-1", "10.244.1.3", "10.244.1.6")
	waitFor(t, "b's change", func() bool { return strings.Contains(dp.last(), "10.244.1.6 . 8080") })
	dp.mu.Lock()
	calls := dp.calls - before
	dp.mu.Unlock()
	if calls != 1 {
		t.Errorf("a change to b took %d Apply calls, want 1 (bad stays quarantined without a new search)", calls)
	}

	// bad is fixed: programmed.
	put("bad", "bad-1", "10.244.1.4", "10.244.1.8")
	waitFor(t, "fixed bad programmed", func() bool { return strings.Contains(dp.last(), "10.244.1.8 . 8080") })
}

// TestRefusalAtStartIsIsolated: a service the kernel refuses is present before the first
// sync: every other service is still programmed.
func TestRefusalAtStartIsIsolated(t *testing.T) {
	dp := &fakeDataplane{refuse: func(text string) bool { return strings.Contains(text, "10.244.9.9") }}
	startProxy(t, dp,
		service("a", "10.96.0.1"), slice("a", "a-1", "10.244.1.2"),
		service("bad", "10.96.0.3"), slice("bad", "bad-1", "10.244.9.9"),
		service("c", "10.96.0.4"), slice("c", "c-1", "10.244.1.7"))
	waitFor(t, "a and c programmed", func() bool {
		out := dp.last()
		return strings.Contains(out, "10.244.1.2 . 8080") && strings.Contains(out, "10.244.1.7 . 8080")
	})
	if out := dp.last(); strings.Contains(out, "default/bad") {
		t.Fatalf("refused service programmed:\n%s", out)
	}
}
