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
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/nftproxy/nftproxy/internal/config"
)

// countingServices and countingSlices count the lists of the informer caches.
type countingServices struct {
	corelisters.ServiceLister
	lists *atomic.Int32
}

func (c countingServices) List(sel labels.Selector) ([]*v1.Service, error) {
	c.lists.Add(1)
	return c.ServiceLister.List(sel)
}

type countingSlices struct {
	discoverylisters.EndpointSliceLister
	lists *atomic.Int32
}

func (c countingSlices) List(sel labels.Selector) ([]*discovery.EndpointSlice, error) {
	c.lists.Add(1)
	return c.EndpointSliceLister.List(sel)
}

// TestChangesSyncWithoutLists: after the first sync, syncs hand the model cache only
// the objects whose names the event handlers noted, read from the listers, and never
// list the informer caches: for created, updated and moved objects, for deletions the
// informer reports as DeletedFinalStateUnknown (a relist after a missed watch event),
// and across a sync that failed after taking the names.
func TestChangesSyncWithoutLists(t *testing.T) {
	dp := &fakeDataplane{}
	client := fake.NewClientset()
	ctx, cancel := context.WithCancel(context.Background())
	create(t, ctx, client, service("a", "10.96.0.1"), slice("a", "a-1", "10.244.1.2"))
	// node port addresses in a CIDR make every sync list the machine's addresses: the
	// way to make a sync fail after it took the names
	var failLocal atomic.Bool
	cfg := Config{NodeName: "node-1", MasqueradeBit: 14, MinSyncPeriod: 10 * time.Millisecond, SyncPeriod: time.Hour,
		NodePortAddresses: config.NodePortAddresses{CIDRs: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}},
		LocalAddrs: func() ([]netip.Addr, error) {
			if failLocal.Load() {
				return nil, errors.New("injected failure")
			}
			return []netip.Addr{netip.MustParseAddr("192.0.2.1")}, nil
		}}
	p := New(client, dp, cfg, logr.Discard())
	var lists atomic.Int32
	p.services = countingServices{p.services, &lists}
	p.slices = countingSlices{p.slices, &lists}
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

	// Deletions the informer found by relisting: gone from its cache, reported as
	// DeletedFinalStateUnknown, as its handlers are called (the tombstone's object may
	// be stale; only its key is read). The API objects stay; nothing relists here.
	svcInformer := p.factory.Core().V1().Services().Informer()
	sliceInformer := p.sliceFactory.Discovery().V1().EndpointSlices().Informer()
	b, err := p.services.Services("default").Get("b")
	if err != nil {
		t.Fatal(err)
	}
	b1, err := p.slices.EndpointSlices("default").Get("b-1")
	if err != nil {
		t.Fatal(err)
	}
	if err := sliceInformer.GetIndexer().Delete(b1); err != nil {
		t.Fatal(err)
	}
	p.changed(sliceKind, cache.DeletedFinalStateUnknown{Key: "default/b-1", Obj: b1})
	waitFor(t, "b-1's endpoint gone", func() bool { return fate(dp.lastRuleset(), "10.244.0.5", "10.96.0.2:80") == "10.244.1.3:8080 100%" })
	if err := svcInformer.GetIndexer().Delete(b); err != nil {
		t.Fatal(err)
	}
	p.changed(serviceKind, cache.DeletedFinalStateUnknown{Key: "default/b"}) // a tombstone without its object
	waitFor(t, "service b gone", func() bool { return !strings.Contains(dp.last(), "default/b:http") })

	if got := lists.Load(); got != listsAfterFirst {
		t.Fatalf("the informer caches were listed %d times after the first sync, want none", got-listsAfterFirst)
	}
	if st := p.Status(); st.Syncs < 4 {
		t.Fatalf("status: %+v", st)
	}
}

// TestPendingFullUntilDone: the first take says full; after a sync that took the names
// and finished (done), the next does not; one that failed (giveBack) returns the names
// and the flag as they were; one that never finished (a panic) leaves full set.
func TestPendingFullUntilDone(t *testing.T) {
	pc := newPending()
	svc := service("a", "10.96.0.1")
	pc.add(serviceKind, svc)
	pc.add(sliceKind, cache.DeletedFinalStateUnknown{Key: "ns/gone"})
	pc.add(otherKind, svc) // the Node's and ServiceCIDRs' names are not kept
	first := pc.take()
	if !first.full || len(first.services) != 1 || len(first.slices) != 1 {
		t.Fatalf("first take: %+v", first)
	}
	if _, ok := first.slices["ns/gone"]; !ok {
		t.Fatalf("the tombstone's key is not pending: %+v", first.slices)
	}
	pc.done()
	pc.add(serviceKind, svc)
	next := pc.take()
	if next.full || len(next.services) != 1 {
		t.Fatalf("take after done: %+v", next)
	}
	pc.giveBack(next)
	again := pc.take()
	if again.full || len(again.services) != 1 {
		t.Fatalf("take after giveBack: %+v", again)
	}
	// no done, no giveBack: the sync panicked
	if afterPanic := pc.take(); !afterPanic.full || len(afterPanic.services) != 0 {
		t.Fatalf("take after an unfinished sync: %+v", afterPanic)
	}
}
