package controller

import (
	"context"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nftproxy/nftproxy/internal/admit"
	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/metrics"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/pipeline"
	"github.com/nftproxy/nftproxy/internal/source"
)

// syncRecorder keeps the sync metrics a Proxy reports.
type syncRecorder struct {
	metrics.Nop
	mu         sync.Mutex
	programmed []programmed
	noLocal    map[string][2]int
	conntrack  map[string]int // runs per family
	setAside   map[string]int
}

func (r *syncRecorder) SetAside(family string, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.setAside == nil {
		r.setAside = map[string]int{}
	}
	r.setAside[family] = n
}

func (r *syncRecorder) setAsideOf(family string) (int, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.setAside[family]
	return n, ok
}

type programmed struct {
	family  string
	latency time.Duration
}

func (r *syncRecorder) Programmed(family string, latency time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.programmed = append(r.programmed, programmed{family, latency})
}

func (r *syncRecorder) NoLocalEndpoints(family string, internal, external int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.noLocal == nil {
		r.noLocal = map[string][2]int{}
	}
	r.noLocal[family] = [2]int{internal, external}
}

func (r *syncRecorder) ConntrackReconciled(family string, _ time.Duration, _ int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conntrack == nil {
		r.conntrack = map[string]int{}
	}
	r.conntrack[family]++
}

func (r *syncRecorder) observed() []programmed {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]programmed(nil), r.programmed...)
}

func triggered(s *discovery.EndpointSlice, at time.Time) *discovery.EndpointSlice {
	s.Annotations = map[string]string{source.TriggerTimeAnnotation: at.UTC().Format(time.RFC3339Nano)}
	return s
}

// TestObserveTriggers: every trigger time a sync programmed is observed under its
// family, as the time from it to the sync.
func TestObserveTriggers(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	web, db := types.NamespacedName{Namespace: "default", Name: "web"}, types.NamespacedName{Namespace: "default", Name: "db"}
	rec := &syncRecorder{}
	observe(map[types.NamespacedName][]source.Trigger{
		web: {{IPv6: false, At: start.Add(time.Second)}, {IPv6: true, At: start.Add(2 * time.Second)}},
		db:  {{IPv6: false, At: start.Add(5 * time.Second)}},
	}, rec, logr.Discard(), start.Add(10*time.Second))
	got := map[programmed]int{}
	for _, o := range rec.observed() {
		got[o]++
	}
	want := map[programmed]int{{metrics.IPv4, 9 * time.Second}: 1, {metrics.IPv6, 8 * time.Second}: 1, {metrics.IPv4, 5 * time.Second}: 1}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("observed %v, want %v", got, want)
	}
	observe(nil, rec, logr.Discard(), start)
	if n := len(rec.observed()); n != 3 {
		t.Errorf("%d observations after a sync without triggers, want still 3", n)
	}
}

func TestNoLocalEndpoints(t *testing.T) {
	a := netip.MustParseAddr
	ep := func(addr, node string) model.Endpoint {
		return model.Endpoint{Addr: a(addr), Port: 80, Ready: true, Serving: true, NodeName: node}
	}
	port := func(name string, ips []netip.Addr, internal, external bool, eps ...model.Endpoint) model.ServicePort {
		sp := model.ServicePort{Name: model.ServicePortName{Namespace: "default", Name: name, Protocol: model.ProtoTCP},
			ClusterIPs: ips, Port: 80, InternalPolicyLocal: internal, ExternalPolicyLocal: external, Endpoints: eps}
		if external {
			sp.NodePort = 30080
		}
		return sp
	}
	v4, dual := []netip.Addr{a("10.96.0.1")}, []netip.Addr{a("10.96.0.2"), a("fd00::2")}
	snap := &model.Snapshot{Node: model.Node{Name: "node-1"}, Services: model.Ports([]model.ServicePort{
		port("internal-elsewhere", v4, true, false, ep("10.244.2.1", "node-2")),
		port("external-elsewhere", v4, false, true, ep("10.244.2.2", "node-2")),
		port("internal-here", v4, true, false, ep("10.244.1.3", "node-1"), ep("10.244.2.3", "node-2")),
		port("internal-none", v4, true, false),                                  // rejected, not dropped
		port("both-dual", dual, true, true, ep("10.244.2.4", "node-2")),         // IPv6: no endpoint
		port("cluster-elsewhere", v4, false, false, ep("10.244.2.5", "node-2")), // Cluster policy
		port("internal-not-ready", v4, true, false, model.Endpoint{Addr: a("10.244.1.6"), NodeName: "node-1"}, ep("10.244.2.6", "node-2")),
	})}
	want := map[string][2]int{metrics.IPv4: {3, 2}, metrics.IPv6: {0, 0}}
	if got := noLocalEndpoints(snap); !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v (internal, external)", got, want)
	}
}

// TestProgrammingLatencyFromTriggerTime: a slice changed after the proxy started is
// timed from its trigger time to the successful sync that programmed it, under its
// family; a failed sync does not end the measurement.
func TestProgrammingLatencyFromTriggerTime(t *testing.T) {
	dp := &fakeDataplane{}
	rec := &syncRecorder{}
	client := fake.NewClientset()
	ctx, cancel := context.WithCancel(context.Background())
	if _, err := client.CoreV1().Services("default").Create(ctx, service("local", "10.96.0.9"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := New(client, dp, Config{NodeName: "node-1", MinSyncPeriod: 10 * time.Millisecond, SyncPeriod: time.Hour, Metrics: rec, Pipeline: pipeline.Config{Compile: compile.Config{MasqueradeBit: 14}}}, logr.Discard())
	done := make(chan struct{})
	go func() { _ = p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "first sync", func() bool { return strings.Contains(dp.last(), "default/local:http") })
	rec.mu.Lock()
	if n := rec.noLocal[metrics.IPv4]; n != [2]int{} || len(rec.programmed) != 0 {
		t.Errorf("after the first sync: no local endpoints %v, programmed %v", n, rec.programmed)
	}
	rec.mu.Unlock()
	waitQuiet(t, p)

	dp.mu.Lock()
	dp.fail = 1 // the next sync fails; the retry comes 1 s later
	dp.mu.Unlock()
	trigger := time.Now()
	if _, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, triggered(slice("local", "local-1", "10.244.2.1"), trigger), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the endpoint programmed", func() bool { return strings.Contains(dp.last(), "10.244.2.1 . 8080") })
	waitFor(t, "the observation", func() bool { return len(rec.observed()) == 1 })
	got := rec.observed()[0]
	// the measurement ends when the retry programs the change, not at the failed sync
	if got.family != metrics.IPv4 || got.latency < time.Second-50*time.Millisecond {
		t.Errorf("observed %+v, want IPv4 and at least the retry interval (1 s)", got)
	}

	// internalTrafficPolicy Local with the only endpoint on another node: counted
	svc, err := client.CoreV1().Services("default").Get(ctx, "local", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	local := v1.ServiceInternalTrafficPolicyLocal
	svc.Spec.InternalTrafficPolicy = &local
	if _, err := client.CoreV1().Services("default").Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "no local endpoints counted", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return rec.noLocal[metrics.IPv4] == [2]int{1, 0}
	})
}

// waitQuiet waits until the proxy has synced every change it was told of and no sync ran
// for 100 ms: the informers deliver their first events asynchronously, so one may come
// after the first sync started and ask for another one, 10 ms after it.
func waitQuiet(t *testing.T, p *Proxy) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	last := -1
	for {
		st := p.Status()
		n := st.Syncs + st.Failures
		if n == last && st.OldestPending.IsZero() {
			return
		}
		last = n
		if time.Now().After(deadline) {
			t.Fatal("the proxy did not become quiet")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestSetAsideReported: after each successful sync the Proxy reports per family how many
// Services its table leaves out for the limits: one Service over
// --max-endpoints-per-service-port, then none once it is back under.
func TestSetAsideReported(t *testing.T) {
	dp := &fakeDataplane{}
	rec := &syncRecorder{}
	client := fake.NewClientset()
	ctx, cancel := context.WithCancel(context.Background())
	for _, o := range []struct{ svc, ip string }{{"big", "10.96.0.9"}, {"small", "10.96.0.10"}} {
		if _, err := client.CoreV1().Services("default").Create(ctx, service(o.svc, o.ip), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, slice("big", "big-1", "10.244.2.1", "10.244.2.2", "10.244.2.3"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, slice("small", "small-1", "10.244.3.1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	limits := admit.DefaultLimits()
	limits.MaxEndpointsPerServicePort = 2
	p := New(client, dp, Config{
		NodeName:      "node-1",
		MinSyncPeriod: 10 * time.Millisecond,
		SyncPeriod:    time.Hour,
		Metrics:       rec,
		Pipeline: pipeline.Config{
			Compile: compile.Config{
				MasqueradeBit: 14,
				Policy: admit.Policy{
					Limits: limits,
				},
			},
		},
	}, logr.Discard())
	done := make(chan struct{})
	go func() { _ = p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "the first sync", func() bool { return strings.Contains(dp.last(), "10.244.3.1 . 8080") })
	waitFor(t, "one Service set aside", func() bool { n, _ := rec.setAsideOf(metrics.IPv4); return n == 1 })
	if strings.Contains(dp.last(), "10.244.2.1") {
		t.Errorf("the Service over the limit was programmed:\n%s", dp.last())
	}
	if _, ok := rec.setAsideOf(metrics.IPv6); !ok {
		t.Error("no report for IPv6")
	}

	if err := client.DiscoveryV1().EndpointSlices("default").Delete(ctx, "big-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, slice("big", "big-2", "10.244.2.4"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the Service programmed", func() bool { return strings.Contains(dp.last(), "10.244.2.4 . 8080") })
	waitFor(t, "none set aside", func() bool { n, _ := rec.setAsideOf(metrics.IPv4); return n == 0 })
}
