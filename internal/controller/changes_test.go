package controller

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/config"
	"github.com/nftproxy/nftproxy/internal/pipeline"
)

// TestChangesSyncWithoutLists: after the first sync, syncs hand the model cache only
// the objects whose names the event handlers noted, read from the listers, and never
// list the informer caches: for created, updated and moved objects, for deletions the
// and across a sync that failed after taking the names. (The source's tests cover the
// deletions an informer reports as DeletedFinalStateUnknown.)
func TestChangesSyncWithoutLists(t *testing.T) {
	dp := &fakeDataplane{}
	client := fake.NewClientset()
	ctx, cancel := context.WithCancel(context.Background())
	create(t, ctx, client, service("a", "10.96.0.1"), slice("a", "a-1", "10.244.1.2"))
	// node port addresses in a CIDR make every sync list the machine's addresses: the
	// way to make a sync fail after it took the names
	var failLocal atomic.Bool
	cfg := Config{
		NodeName:      "node-1",
		MinSyncPeriod: 10 * time.Millisecond,
		SyncPeriod:    time.Hour,
		Pipeline: pipeline.Config{
			Compile: compile.Config{
				MasqueradeBit: 14,
			},
			NodePortAddresses: config.NodePortAddresses{CIDRs: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}},
			LocalAddrs: func() ([]netip.Addr, error) {
				if failLocal.Load() {
					return nil, errors.New("injected failure")
				}
				return []netip.Addr{netip.MustParseAddr("192.0.2.1")}, nil
			},
		},
	}
	p := New(client, dp, cfg, logr.Discard())
	var lists atomic.Int32
	p.lists = func() ([]*v1.Service, []*discovery.EndpointSlice, error) {
		lists.Add(1)
		return p.src.Lists()
	}
	done := make(chan struct{})
	go func() { _ = p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	waitFor(t, "first sync with service a", func() bool { return fate(dp.lastRuleset(), "10.244.0.5", "10.96.0.1:80") == "10.244.1.2:8080 100%" })
	if lists.Load() == 0 {
		t.Fatal("the first sync did not list the informer caches")
	}
	listsAfterFirst := lists.Load()

	// created, updated, and a slice moving from one service to another
	if _, err := client.CoreV1().Services("default").Create(ctx, service("b", "10.96.0.2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, slice("b", "b-1", "10.244.1.7"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.DiscoveryV1().EndpointSlices("default").Update(ctx, slice("b", "a-1", "10.244.1.3"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b with both slices, a with none", func() bool {
		rs := dp.lastRuleset()
		return fate(rs, "10.244.0.5", "10.96.0.2:80") == "10.244.1.3:8080 50%, 10.244.1.7:8080 50%" && fate(rs, "10.244.0.5", "10.96.0.1:80") == "reject"
	})

	// A failed sync gives the names back: c comes with the retry.
	failLocal.Store(true)
	if _, err := client.CoreV1().Services("default").Create(ctx, service("c", "10.96.0.3"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a failed sync", func() bool { return p.Status().Failures > 0 })
	failLocal.Store(false)
	waitFor(t, "c after the retry", func() bool { return strings.Contains(dp.last(), "default/c:http") })

	// and a deletion
	if err := client.CoreV1().Services("default").Delete(ctx, "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "service b gone", func() bool { return !strings.Contains(dp.last(), "default/b:http") })

	if got := lists.Load(); got != listsAfterFirst {
		t.Fatalf("the informer caches were listed %d times after the first sync, want none", got-listsAfterFirst)
	}
	if st := p.Status(); st.Syncs < 4 {
		t.Fatalf("status: %+v", st)
	}
}
