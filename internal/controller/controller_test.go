package controller

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/vishvananda/netlink"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/pipeline"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
	"github.com/nftproxy/nftproxy/nft/trace"
)

// fakeDataplane records applied rulesets and can be told to fail.
type fakeDataplane struct {
	mu      sync.Mutex
	applied [][]*nft.Ruleset
	fail    int // fail this many Apply calls
	resyncs int
	calls   int
	// refuse, when set, makes Apply refuse (as the kernel does) rulesets whose rendered
	// text it matches
	refuse func(text string) bool
}

func (f *fakeDataplane) Apply(rs ...*nft.Ruleset) (kernel.Stats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.fail > 0 {
		f.fail--
		return kernel.Stats{}, errors.New("injected kernel failure")
	}
	if f.refuse != nil {
		for _, r := range rs {
			if f.refuse(nft.Render(r)) {
				return kernel.Stats{}, &kernel.RejectedError{Messages: 1, Err: errors.New("injected refusal")}
			}
		}
	}
	f.applied = append(f.applied, rs)
	return kernel.Stats{}, nil
}

func (f *fakeDataplane) Resync() { f.mu.Lock(); f.resyncs++; f.mu.Unlock() }

// Applied is the rulesets of the last successful Apply.
func (f *fakeDataplane) Applied() *kernel.Applied {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.applied) == 0 {
		return nil
	}
	return kernel.AppliedOf(f.applied[len(f.applied)-1]...)
}

// last returns the rendered ip-family ruleset of the last successful Apply.
func (f *fakeDataplane) last() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.applied) == 0 {
		return ""
	}
	for _, rs := range f.applied[len(f.applied)-1] {
		if rs.Family == nft.IPv4 {
			return nft.Render(rs)
		}
	}
	return ""
}

// lastRuleset returns the ip-family ruleset of the last successful Apply; nil before.
func (f *fakeDataplane) lastRuleset() *nft.Ruleset {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.applied) == 0 {
		return nil
	}
	for _, rs := range f.applied[len(f.applied)-1] {
		if rs.Family == nft.IPv4 {
			return rs
		}
	}
	return nil
}

// fate traces the first packet of a TCP connection from saddr, arriving from the
// network, to dest ("ip:port") through rs, whatever its shape: "reject", "drop",
// "accept" (not translated), or the endpoints it reaches with their probabilities
// ("10.244.1.2:8080 50%, 10.244.1.3:8080 50%"), "+masquerade" after those masqueraded.
// Trace errors are returned as "error: ...".
func fate(rs *nft.Ruleset, saddr, dest string) string {
	if rs == nil {
		return "(nothing applied)"
	}
	d := netip.MustParseAddrPort(dest)
	res, err := trace.Trace(rs, trace.Packet{Family: nft.IPv4, Saddr: netip.MustParseAddr(saddr), Daddr: d.Addr(), Dport: d.Port(),
		L4Proto: 6, Hook: nft.Prerouting}, trace.Context{})
	if err != nil {
		return "error: " + err.Error()
	}
	probs := map[string]float64{}
	for _, o := range res.Outcomes {
		k := o.Verdict.String()
		if o.Verdict == trace.Accept && o.DNAT.IsValid() {
			k = o.DNAT.String()
		}
		if o.Masquerade {
			k += "+masquerade"
		}
		probs[k] += o.Probability
	}
	var out []string
	for k, p := range probs {
		if len(probs) == 1 && !strings.Contains(k, ":") {
			return k
		}
		out = append(out, fmt.Sprintf("%s %.0f%%", k, p*100))
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

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

func startProxy(t *testing.T, dp *fakeDataplane, objs ...any) (*fake.Clientset, *Proxy) {
	t.Helper()
	return startProxyEvery(t, dp, time.Hour, objs...)
}

func startProxyEvery(t *testing.T, dp *fakeDataplane, syncPeriod time.Duration, objs ...any) (*fake.Clientset, *Proxy) {
	t.Helper()
	return startProxyFull(t, dp, syncPeriod, objs...)
}

// startProxyWith runs the proxy on any dataplane.
func startProxyWith(t *testing.T, dp Dataplane, objs ...any) (*fake.Clientset, *Proxy) {
	t.Helper()
	return startProxyFull(t, dp, time.Hour, objs...)
}

func startProxyFull(t *testing.T, dp Dataplane, syncPeriod time.Duration, objs ...any) (*fake.Clientset, *Proxy) {
	t.Helper()
	client := fake.NewClientset()
	ctx, cancel := context.WithCancel(context.Background())
	create(t, ctx, client, objs...)
	p := New(client, dp, Config{NodeName: "node-1", MinSyncPeriod: 10 * time.Millisecond, SyncPeriod: syncPeriod, Pipeline: pipeline.Config{Compile: compile.Config{MasqueradeBit: 14}}}, logr.Discard())
	done := make(chan struct{})
	go func() { _ = p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return client, p
}

// create creates the Services and EndpointSlices among objs in client.
func create(t *testing.T, ctx context.Context, client *fake.Clientset, objs ...any) {
	t.Helper()
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *v1.Service:
			_, err = client.CoreV1().Services(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *discovery.EndpointSlice:
			_, err = client.DiscoveryV1().EndpointSlices(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestSyncsOnStartAndOnChange(t *testing.T) {
	dp := &fakeDataplane{}
	client, p := startProxy(t, dp, service("a", "10.96.0.1"), slice("a", "a-1", "10.244.1.2"))
	waitFor(t, "first sync with service a", func() bool { return strings.Contains(dp.last(), "default/a:http") })

	ctx := context.Background()
	if _, err := client.CoreV1().Services("default").Create(ctx, service("b", "10.96.0.2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "service b (no endpoints) programmed as rejected", func() bool {
		return strings.Contains(dp.last(), `default/b:http`) && fate(dp.lastRuleset(), "10.244.0.5", "10.96.0.2:80") == "reject"
	})
	if _, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, slice("b", "b-1", "10.244.1.7"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "service b's endpoint", func() bool { return fate(dp.lastRuleset(), "10.244.0.5", "10.96.0.2:80") == "10.244.1.7:8080 100%" })
	if err := client.CoreV1().Services("default").Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "service a removed", func() bool { return !strings.Contains(dp.last(), "default/a:http") })
	if st := p.Status(); st.Syncs < 4 || !st.OldestPending.IsZero() {
		t.Fatalf("status after syncs: %+v", st)
	}
}

func TestBadInputIsReportedAndSkipped(t *testing.T) {
	dp := &fakeDataplane{}
	bad := slice("a", "a-bad", "10.244.1.2", "not-an-ip", "2001:db8::1")
	client, _ := startProxy(t, dp, service("a", "10.96.0.1"), bad, service("garbage", "10.96.999.1"), service("ok", "10.96.0.3"), slice("ok", "ok-1", "10.244.1.9"))
	waitFor(t, "good parts programmed", func() bool {
		out := dp.last()
		return strings.Contains(out, "10.244.1.2 . 8080") && strings.Contains(out, "10.244.1.9 . 8080")
	})
	if out := dp.last(); strings.Contains(out, "garbage") {
		t.Fatalf("service with a garbage cluster IP was programmed:\n%s", out)
	}
	waitFor(t, "warning events for the bad slice and service", func() bool {
		evs, err := client.CoreV1().Events("").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false
		}
		var slice, svc bool
		for _, e := range evs.Items {
			slice = slice || (e.InvolvedObject.Name == "a-bad" && strings.Contains(e.Message, "not-an-ip"))
			svc = svc || (e.InvolvedObject.Name == "garbage" && strings.Contains(e.Message, "10.96.999.1"))
		}
		return slice && svc
	})
}

func TestFailedApplyIsRetried(t *testing.T) {
	dp := &fakeDataplane{fail: 1}
	_, p := startProxy(t, dp, service("a", "10.96.0.1"), slice("a", "a-1", "10.244.1.2"))
	// The retry interval is max(min-sync-period, 1s).
	waitFor(t, "retry after the injected failure", func() bool { return strings.Contains(dp.last(), "default/a:http") })
	st := p.Status()
	if st.Failures != 1 || st.Syncs < 1 || st.LastError != "" {
		t.Fatalf("status: %+v", st)
	}
}

// fakeConntrack records delete requests.
type fakeConntrack struct {
	mu      sync.Mutex
	filters []netlink.CustomConntrackFilter
}

func (f *fakeConntrack) ConntrackDeleteFilters(_ netlink.ConntrackTableType, _ netlink.InetFamily, filters ...netlink.CustomConntrackFilter) (uint, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.filters = append(f.filters, filters...)
	return uint(len(filters)), nil
}

// matches reports whether a recorded filter would delete a UDP entry to dst:80 DNATed
// to ep.
func (f *fakeConntrack) matches(dst, ep string) bool {
	return f.selects(model.ProtoUDP, dst, 80, ep, 8080)
}

// selects reports whether a recorded filter would delete an IPv4 entry of proto from a
// pod to dst:port whose replies come from replySrc:replyPort. An SCTP entry has ports 0,
// as the netlink library reports it.
func (f *fakeConntrack) selects(proto uint8, dst string, port uint16, replySrc string, replyPort uint16) bool {
	flow := &netlink.ConntrackFlow{FamilyType: 2}
	flow.Forward.Protocol, flow.Forward.DstIP, flow.Forward.DstPort = proto, net.ParseIP(dst).To4(), port
	flow.Forward.SrcIP = net.ParseIP("10.244.1.50").To4()
	flow.Forward.SrcPort = 40000
	flow.Reverse.Protocol, flow.Reverse.SrcIP, flow.Reverse.DstIP = proto, net.ParseIP(replySrc).To4(), flow.Forward.SrcIP
	flow.Reverse.SrcPort, flow.Reverse.DstPort = replyPort, 40000
	if proto == model.ProtoSCTP {
		flow.Forward.SrcPort, flow.Forward.DstPort, flow.Reverse.SrcPort, flow.Reverse.DstPort = 0, 0, 0, 0
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, filter := range f.filters {
		if filter.MatchConntrackFlow(flow) {
			return true
		}
	}
	return false
}

func (f *fakeConntrack) reset() { f.mu.Lock(); f.filters = nil; f.mu.Unlock() }

func TestStaleUDPConntrackIsDeleted(t *testing.T) {
	dp, ct := &fakeDataplane{}, &fakeConntrack{}
	svc := service("dns", "10.96.0.53")
	svc.Spec.Ports[0].Protocol = v1.ProtocolUDP
	sl := slice("dns", "dns-1", "10.244.1.2")
	proto := v1.ProtocolUDP
	sl.Ports[0].Protocol = &proto
	client := fake.NewClientset(svc, sl)
	p := New(client, dp, Config{NodeName: "node-1", MinSyncPeriod: 10 * time.Millisecond, SyncPeriod: time.Hour, Conntrack: ct, Pipeline: pipeline.Config{Compile: compile.Config{MasqueradeBit: 14}}}, logr.Discard())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = p.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	waitFor(t, "first sync", func() bool { return strings.Contains(dp.last(), "10.244.1.2 . 8080") })

	sl.Endpoints[0].Addresses = []string{"10.244.1.3"}
	if _, err := client.DiscoveryV1().EndpointSlices("default").Update(ctx, sl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "conntrack entries to the replaced endpoint deleted", func() bool { return ct.matches("10.96.0.53", "10.244.1.2") })
	if ct.matches("10.96.0.53", "10.244.1.3") {
		t.Error("entries to the new endpoint would be deleted too")
	}
}

// TestRepairDeletesEscapedConntrack: the sync that repairs the table (even when its
// first attempt fails) deletes the conntrack entries of connections to cluster IPs that
// escaped NAT while it was broken, of every protocol, and nothing DNATed or to another
// frontend; a normal sync does not.
func TestRepairDeletesEscapedConntrack(t *testing.T) {
	dp, ct := &fakeDataplane{}, &fakeConntrack{}
	web := service("web", "10.96.0.10")
	web.Spec.ExternalIPs = []string{"192.0.2.10"}
	dns := service("dns", "10.96.0.53")
	dns.Spec.Ports[0].Protocol, dns.Spec.Ports[0].Port = v1.ProtocolUDP, 53
	sig := service("sig", "10.96.0.20") // no endpoints
	sig.Spec.Ports[0].Protocol, sig.Spec.Ports[0].Port = v1.ProtocolSCTP, 3868
	dnsSlice := slice("dns", "dns-1", "10.244.1.3")
	udp := v1.ProtocolUDP
	dnsSlice.Ports[0].Protocol = &udp
	client := fake.NewClientset(web, slice("web", "web-1", "10.244.1.2"), dns, dnsSlice, sig)
	p := New(client, dp, Config{NodeName: "node-1", MinSyncPeriod: 10 * time.Millisecond, SyncPeriod: time.Hour, Conntrack: ct, Pipeline: pipeline.Config{Compile: compile.Config{MasqueradeBit: 14}}}, logr.Discard())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = p.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	type entry struct {
		what           string
		proto          uint8
		dst            string
		port           uint16
		replySrc       string
		replyPort      uint16
		escapedFromNAT bool
	}
	entries := []entry{
		{"TCP to the cluster IP, not DNATed", model.ProtoTCP, "10.96.0.10", 80, "10.96.0.10", 80, true},
		{"UDP to the cluster IP, not DNATed", model.ProtoUDP, "10.96.0.53", 53, "10.96.0.53", 53, true},
		{"SCTP to the cluster IP, not DNATed", model.ProtoSCTP, "10.96.0.20", 3868, "10.96.0.20", 3868, true},
		{"TCP DNATed to the endpoint", model.ProtoTCP, "10.96.0.10", 80, "10.244.1.2", 8080, false},
		{"UDP DNATed to the endpoint", model.ProtoUDP, "10.96.0.53", 53, "10.244.1.3", 8080, false},
		{"TCP to the external IP, not DNATed", model.ProtoTCP, "192.0.2.10", 80, "192.0.2.10", 80, false},
		{"TCP to a port the cluster IP does not serve", model.ProtoTCP, "10.96.0.10", 81, "10.96.0.10", 81, false},
	}
	check := func(after string, repaired bool) {
		t.Helper()
		for _, e := range entries {
			if got := ct.selects(e.proto, e.dst, e.port, e.replySrc, e.replyPort); got != (repaired && e.escapedFromNAT) {
				t.Errorf("after %s: %s: deleted = %v, want %v", after, e.what, got, repaired && e.escapedFromNAT)
			}
		}
	}
	synced := func(n int) func() bool { return func() bool { return p.Status().Syncs >= n } }

	// Syncs are counted from after each reset: the informers' first events may bring a
	// normal sync right after the first one, which must not stand in for a later sync
	waitFor(t, "first sync", synced(1)) // Syncs counts after the conntrack cleanup
	ct.reset()                          // (the first sync deletes dns's un-DNATed entries: a restart)
	n := p.Status().Syncs
	if _, err := client.CoreV1().Services("default").Create(ctx, service("other", "10.96.0.2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a normal sync", synced(n+1))
	check("a normal sync", false)

	dp.mu.Lock()
	dp.fail = 1 // the repair's first attempt fails; its retry must still clean up
	dp.mu.Unlock()
	p.RequestRepair("test: table deleted")
	escaped := entries[0]
	waitFor(t, "the repair's sync after a failed attempt", func() bool {
		return p.Status().Failures == 1 && ct.selects(escaped.proto, escaped.dst, escaped.port, escaped.replySrc, escaped.replyPort)
	})
	check("the repair", true)

	ct.reset()
	n = p.Status().Syncs
	if err := client.CoreV1().Services("default").Delete(ctx, "other", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a normal sync after the repair", synced(n+1))
	check("a normal sync after the repair", false)
}

// TestPeriodicSyncsAreIncremental: periodic syncs (every --sync-period) send only changes;
// the whole table is rewritten when a repair is requested (the netlink monitor does).
func TestPeriodicSyncsAreIncremental(t *testing.T) {
	dp := &fakeDataplane{}
	_, p := startProxyEvery(t, dp, 20*time.Millisecond, service("a", "10.96.0.1"), slice("a", "a-1", "10.244.1.2"))
	waitFor(t, "five periodic syncs", func() bool { dp.mu.Lock(); defer dp.mu.Unlock(); return len(dp.applied) >= 5 })
	dp.mu.Lock()
	resyncs := dp.resyncs
	dp.mu.Unlock()
	if resyncs != 0 {
		t.Fatalf("periodic syncs rewrote the table %d times, want 0 within FullSyncPeriod", resyncs)
	}
	p.RequestRepair("test: table tampered with")
	waitFor(t, "the repair's full rewrite", func() bool { dp.mu.Lock(); defer dp.mu.Unlock(); return dp.resyncs == 1 })
}

// Config.CachesSynced is called once, when the caches hold the objects and before the
// first sync applies anything (nftproxy drops its start-up heap ballast there).
func TestCachesSyncedBeforeFirstSync(t *testing.T) {
	dp := &fakeDataplane{}
	client := fake.NewClientset()
	ctx, cancel := context.WithCancel(context.Background())
	create(t, ctx, client, service("a", "10.96.0.1"), slice("a", "a-1", "10.244.1.2"))
	var calls, appliedBefore atomic.Int32
	p := New(client, dp, Config{
		NodeName:      "node-1",
		MinSyncPeriod: 10 * time.Millisecond,
		SyncPeriod:    time.Hour,
		CachesSynced: func() {
			calls.Add(1)
			dp.mu.Lock()
			appliedBefore.Store(int32(dp.calls))
			dp.mu.Unlock()
		},
		Pipeline: pipeline.Config{
			Compile: compile.Config{
				MasqueradeBit: 14,
			},
		},
	}, logr.Discard())
	done := make(chan struct{})
	go func() { _ = p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "first sync with service a", func() bool { return strings.Contains(dp.last(), "default/a:http") })
	if _, err := client.CoreV1().Services("default").Create(ctx, service("b", "10.96.0.2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "service b", func() bool { return strings.Contains(dp.last(), "default/b:http") })
	if calls.Load() != 1 || appliedBefore.Load() != 0 {
		t.Fatalf("CachesSynced called %d times, after %d applies; want once, before any", calls.Load(), appliedBefore.Load())
	}
}
