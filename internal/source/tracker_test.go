package source

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

func service(name, clusterIP string) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: v1.ServiceSpec{
			Type: v1.ServiceTypeClusterIP, ClusterIP: clusterIP, ClusterIPs: []string{clusterIP},
			Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}},
		},
	}
}

func slice(svc, name string, addrs ...string) *discovery.EndpointSlice {
	port, pname, proto := int32(8080), "http", v1.ProtocolTCP
	s := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{discovery.LabelServiceName: svc}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: &pname, Port: &port, Protocol: &proto}},
	}
	for _, a := range addrs {
		s.Endpoints = append(s.Endpoints, discovery.Endpoint{Addresses: []string{a}})
	}
	return s
}

func triggered(s *discovery.EndpointSlice, at time.Time) *discovery.EndpointSlice {
	s.Annotations = map[string]string{TriggerTimeAnnotation: at.UTC().Format(time.RFC3339Nano)}
	return s
}

// TestTrackerFullUntilDone: the first take says full; after a sync that took the names
// and finished (Done), the next does not; one that failed (GiveBack) returns the names
// and the flag as they were; one that never finished (a panic) leaves full set. Since is
// the first change of what was taken, given back if older than what came since.
func TestTrackerFullUntilDone(t *testing.T) {
	tr := NewTracker(logr.Discard(), time.Now())
	if !tr.Oldest().IsZero() {
		t.Fatal("a new tracker has a pending change")
	}
	svc := service("a", "10.96.0.1")
	before := time.Now()
	tr.Add(Services, svc, false)
	tr.Add(EndpointSlices, cache.DeletedFinalStateUnknown{Key: "ns/gone"}, true)
	tr.Add(Other, svc, false) // the Node's and ServiceCIDRs' names are not kept
	oldest := tr.Oldest()
	if oldest.Before(before) || oldest.After(time.Now()) {
		t.Fatalf("oldest change %v, want the first Add's time", oldest)
	}
	first := tr.Take()
	if !first.Full || len(first.Services) != 1 || len(first.Slices) != 1 || first.Since != oldest {
		t.Fatalf("first take: %+v", first)
	}
	if _, ok := first.Slices["ns/gone"]; !ok {
		t.Fatalf("the tombstone's key is not pending: %+v", first.Slices)
	}
	if !tr.Oldest().IsZero() {
		t.Error("a change is still pending after Take")
	}
	tr.Done(&first)
	if first.Full || first.Services != nil || first.Slices != nil || first.Since != oldest {
		t.Errorf("after Done the taken changes keep names or lose their time: %+v", first)
	}
	tr.Add(Services, svc, false)
	next := tr.Take()
	if next.Full || len(next.Services) != 1 {
		t.Fatalf("take after done: %+v", next)
	}
	tr.Add(Other, svc, false) // newer than next's
	tr.GiveBack(next)
	if tr.Oldest() != next.Since {
		t.Errorf("after GiveBack the oldest change is %v, want the one given back (%v)", tr.Oldest(), next.Since)
	}
	again := tr.Take()
	if again.Full || len(again.Services) != 1 {
		t.Fatalf("take after giveBack: %+v", again)
	}
	// no Done, no GiveBack: the sync panicked
	if afterPanic := tr.Take(); !afterPanic.Full || len(afterPanic.Services) != 0 || !afterPanic.Since.IsZero() {
		t.Fatalf("take after an unfinished sync: %+v", afterPanic)
	}
}

func TestTrackerTriggers(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tr := NewTracker(logr.Discard(), start)
	web := types.NamespacedName{Namespace: "default", Name: "web"}
	ev := func(s any) { tr.Add(EndpointSlices, s, false) }

	ev(triggered(slice("web", "web-1", "10.244.1.1"), start.Add(-time.Second))) // before start
	ev(triggered(slice("web", "web-1", "10.244.1.1"), start.Add(time.Second)))
	v6 := triggered(slice("web", "web-2", "fd00::1"), start.Add(2*time.Second))
	v6.AddressType = discovery.AddressTypeIPv6
	ev(v6)
	fqdn := triggered(slice("web", "web-3", "example.com"), start.Add(3*time.Second))
	fqdn.AddressType = discovery.AddressTypeFQDN
	ev(fqdn)
	bad := slice("web", "web-4", "10.244.1.4")
	bad.Annotations = map[string]string{TriggerTimeAnnotation: "yesterday"}
	ev(bad)
	ev(slice("web", "web-5", "10.244.1.5"))                                                           // no annotation
	tr.Add(Services, triggered(slice("web", "web-6", "10.244.1.6"), start.Add(4*time.Second)), false) // not a slice informer's
	ev(service("web", "10.96.0.1"))                                                                   // not a slice

	want := map[types.NamespacedName][]Trigger{web: {{false, start.Add(time.Second)}, {true, start.Add(2 * time.Second)}}}
	taken := tr.Take()
	if !reflect.DeepEqual(taken.Triggers, want) {
		t.Fatalf("taken %v, want %v", taken.Triggers, want)
	}
	if again := tr.Take(); len(again.Triggers) != 0 {
		t.Errorf("taken twice: %v", again.Triggers)
	}

	// a failed sync gives them back, before what came since; Done keeps them
	ev(triggered(slice("web", "web-1", "10.244.1.1"), start.Add(5*time.Second)))
	tr.Done(&taken)
	tr.GiveBack(taken)
	want[web] = append(want[web], Trigger{false, start.Add(5 * time.Second)})
	taken = tr.Take()
	if !reflect.DeepEqual(taken.Triggers, want) {
		t.Fatalf("after GiveBack %v, want %v", taken.Triggers, want)
	}

	// a deleted slice drops its Service's pending times, also through a tombstone
	ev(triggered(slice("web", "web-1", "10.244.1.1"), start.Add(6*time.Second)))
	tr.Add(EndpointSlices, cache.DeletedFinalStateUnknown{Key: "default/web-1", Obj: slice("web", "web-1")}, false)
	if taken := tr.Take(); len(taken.Triggers) != 0 {
		t.Errorf("after a tombstone: %v", taken.Triggers)
	}
	ev(triggered(slice("web", "web-1", "10.244.1.1"), start.Add(6*time.Second)))
	tr.Add(EndpointSlices, slice("web", "web-1"), true)
	if taken := tr.Take(); len(taken.Triggers) != 0 {
		t.Errorf("after delete: %v", taken.Triggers)
	}

	// bounded per Service while syncs fail
	for i := range 2 * maxTriggersPerService {
		ev(triggered(slice("web", "web-1", "10.244.1.1"), start.Add(time.Duration(i+1)*time.Second)))
	}
	taken = tr.Take()
	tr.GiveBack(taken)
	if n := len(tr.Take().Triggers[web]); n != maxTriggersPerService || taken.Triggers[web][0].At != start.Add(time.Second) {
		t.Errorf("%d pending, first %v", n, taken.Triggers[web][0].At)
	}
}

// TestTriggersTransform: the informers keep a slice's trigger time only when it can be
// timed.
func TestTriggersTransform(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tr := NewTracker(logr.Discard(), start)
	for _, tc := range []struct {
		value string
		kept  bool
	}{{"2026-01-01T00:00:01.5Z", true}, {"2025-12-31T23:59:59Z", false}, {"yesterday", false}} {
		s := slice("web", "web-1", "10.244.1.1")
		s.Annotations = map[string]string{TriggerTimeAnnotation: tc.value, "other": "x"}
		got := slim(s, tr.timed).(*discovery.EndpointSlice).Annotations
		if (tc.kept && (len(got) != 1 || got[TriggerTimeAnnotation] != tc.value)) || (!tc.kept && got != nil) {
			t.Errorf("%s: annotations %v", tc.value, got)
		}
	}
	svc := service("web", "10.96.0.1")
	svc.Annotations = map[string]string{TriggerTimeAnnotation: "2026-01-01T00:00:01Z"}
	if slim(svc, tr.timed).(*v1.Service).Annotations != nil {
		t.Error("a Service kept annotations")
	}
}

// TestSourceDelta: a started Source tracks the informers' events by name, and Delta
// reads each name's object from the caches: nil for an object gone from them, also
// when the informer reports the deletion as a tombstone (a relist after a missed watch
// event) or a tombstone without its object.
func TestSourceDelta(t *testing.T) {
	client := fake.NewClientset(service("a", "10.96.0.1"), slice("a", "a-1", "10.244.1.2"))
	changes := make(chan Kind, 100)
	s := New(client, Config{NodeName: "node-1", Changed: func(k Kind) { changes <- k }}, logr.Discard())
	ctx, cancel := context.WithCancel(context.Background())
	stop := s.Start(ctx)
	defer func() { cancel(); stop() }() // the informers end with ctx; stop waits for them
	if !s.WaitForCaches(ctx) {
		t.Fatal("caches not synced")
	}
	first := s.Take()
	if !first.Full {
		t.Fatalf("first take not full: %+v", first)
	}
	svcs, slices, err := s.Lists()
	if err != nil || len(svcs) != 1 || len(slices) != 1 {
		t.Fatalf("lists: %d services, %d slices, %v", len(svcs), len(slices), err)
	}
	s.Done(&first)

	if _, err := client.CoreV1().Services("default").Create(ctx, service("b", "10.96.0.2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// the informers deliver events asynchronously: wait until b's is tracked (bounded)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		s.mu.Lock()
		_, ok := s.pending.Services["default/b"]
		s.mu.Unlock()
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("service b's event not tracked")
		}
	}
	select {
	case <-changes:
	default:
		t.Error("Config.Changed was not called")
	}
	// tombstones, as an informer reports what it found deleted by relisting
	a1, err := s.slices.EndpointSlices("default").Get("a-1")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.sliceFactory.Discovery().V1().EndpointSlices().Informer().GetIndexer().Delete(a1); err != nil {
		t.Fatal(err)
	}
	s.event(EndpointSlices, cache.DeletedFinalStateUnknown{Key: "default/a-1", Obj: a1}, true)
	s.event(Services, cache.DeletedFinalStateUnknown{Key: "default/gone"}, true)

	c := s.Take()
	if c.Full || len(c.Services) < 2 || len(c.Slices) != 1 {
		t.Fatalf("changes: %+v", c)
	}
	d, err := s.Delta(c)
	if err != nil {
		t.Fatal(err)
	}
	if b := d.Services[types.NamespacedName{Namespace: "default", Name: "b"}]; b == nil || b.Spec.ClusterIP != "10.96.0.2" {
		t.Errorf("service b in the delta: %+v", b)
	}
	if gone, ok := d.Services[types.NamespacedName{Namespace: "default", Name: "gone"}]; !ok || gone != nil {
		t.Errorf("the tombstone's service is not deleted in the delta: %v, %v", gone, ok)
	}
	if a, ok := d.Slices[types.NamespacedName{Namespace: "default", Name: "a-1"}]; !ok || a != nil {
		t.Errorf("the tombstone's slice is not deleted in the delta: %v, %v", a, ok)
	}
}
