package kernels

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	vnl "github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nftproxy/nftproxy/internal/admit"
	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/conntrack"
	"github.com/nftproxy/nftproxy/internal/controller"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/pipeline"
	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/internal/testrules"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

// The fast path (--fast-path-interfaces) with real packets, in the topology of
// TestClusterIPConnection:
//
//	client 192.168.1.2 ── nd0 192.168.1.1 node 192.168.2.1 nd1 ── 192.168.2.2 endpoint (10.244.0.1)
//
// TestFastPathOffload needs a kernel with nf_tables flowtables (Debian's have them;
// `make kernels` boots them) and is skipped, saying so, on one without;
// TestFastPathFallback runs on either.

// echoTCP serves 10.244.0.1:8080 in ep: every connection gets its bytes back; received
// counts them.
func echoTCP(t *testing.T, ep *testnetns.NS, received *atomic.Int64) {
	t.Helper()
	var l net.Listener
	if err := ep.Do(func() (err error) { l, err = net.Listen("tcp4", "10.244.0.1:8080"); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					received.Add(int64(n))
					if err != nil {
						return
					}
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
			}()
		}
	}()
}

// echoUDP serves 10.244.0.1:8080/udp in ep the same way.
func echoUDP(t *testing.T, ep *testnetns.NS, received *atomic.Int64) {
	t.Helper()
	var pc net.PacketConn
	if err := ep.Do(func() (err error) { pc, err = net.ListenPacket("udp4", "10.244.0.1:8080"); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			received.Add(int64(n))
			_, _ = pc.WriteTo(buf[:n], from)
		}
	}()
}

// fastPathRuleset compiles a TCP and a UDP service on 10.96.0.10:80 with the endpoint
// 10.244.0.1:8080 (none with n 0), with the fast path on devs.
func fastPathRuleset(n int, devs ...string) (*nft.Ruleset, *model.Snapshot) {
	tcp := testrules.Service("web", "10.96.0.10", 0, 0, n)
	udp := testrules.Service("dns", "10.96.0.10", 0, 0, n)
	udp.Name.Protocol = model.ProtoUDP
	cfg := testrules.Config()
	cfg.FastPath = compile.FastPath{Devices: devs}
	snap := &model.Snapshot{Services: model.Ports([]model.ServicePort{tcp, udp})}
	rs, _ := compile.NewCompiler(cfg, compile.NewSlots()).Compile(snap)
	return rs, snap
}

// requireFlowtables skips the test on a kernel without flowtables, naming it.
func requireFlowtables(t *testing.T, a *kernel.Applier) {
	t.Helper()
	if err := a.ProbeFlowtables(nft.IPv4); err != nil {
		var u unix.Utsname
		_ = unix.Uname(&u)
		t.Skipf("kernel %s has no nf_tables flowtables (CONFIG_NF_FLOW_TABLE, nf_flow_table_inet): %v; `make kernels` runs this test in Debian's kernels",
			unix.ByteSliceToString(u.Release[:]), err)
	}
}

// offloaded returns the node's conntrack entries of protocol proto to 10.96.0.10 and
// whether one of them is offloaded ("[OFFLOAD]" in conntrack -L; "[HW_OFFLOAD]" on
// hardware).
func offloaded(t *testing.T, node *testnetns.NS, proto string) (string, bool) {
	t.Helper()
	out, _ := node.Run(t, "", "conntrack", "-L", "-p", proto, "-d", "10.96.0.10")
	return out, strings.Contains(out, "OFFLOAD]")
}

// TestFastPathOffload: with the fast path on nd0 and nd1, an established TCP connection
// and a UDP flow through the ClusterIP are offloaded (their conntrack entries carry
// [OFFLOAD]) and go on carrying data both ways. Then the endpoint is removed and its
// entries are deleted as nftproxy's conntrack cleanup deletes them: no byte reaches the
// endpoint any more, the flowtable keeps no stale flow.
func TestFastPathOffload(t *testing.T) {
	client, node, ep := topology(t)
	a := kernel.New(kernel.WithNetNS(node.FD))
	requireFlowtables(t, a)
	var tcpGot, udpGot atomic.Int64
	echoTCP(t, ep, &tcpGot)
	echoUDP(t, ep, &udpGot)
	rs, before := fastPathRuleset(1, "nd0", "nd1")
	if _, err := a.Apply(rs); err != nil {
		t.Fatalf("applying the ruleset with the fast path: %v", err)
	}
	if out := node.MustRun(t, "", "nft", "list", "table", "ip", "nftproxy"); !strings.Contains(out, "flow add @fastpath") ||
		!strings.Contains(out, "devices = { nd0, nd1 }") {
		t.Fatalf("the table lacks the fast path:\n%s", out)
	}

	tc, err := client.DialTCP("192.168.1.2", "10.96.0.10", 80)
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	var uc net.Conn
	if err := client.Do(func() (err error) { uc, err = net.Dial("udp4", "10.96.0.10:80"); return err }); err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	// round trips: bounded, each within 5 s
	roundTrip := func(c net.Conn, msg string) error {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte(msg)); err != nil {
			return err
		}
		buf := make([]byte, len(msg))
		if _, err := io.ReadFull(c, buf); err != nil {
			return err
		}
		if string(buf) != msg {
			return fmt.Errorf("echoed %q, want %q", buf, msg)
		}
		return nil
	}
	for proto, c := range map[string]net.Conn{"tcp": tc, "udp": uc} {
		var out string
		ok := false
		for i := 0; i < 50 && !ok; i++ {
			if err := roundTrip(c, fmt.Sprintf("%s-%03d", proto, i)); err != nil {
				t.Fatalf("%s round trip %d through the ClusterIP: %v", proto, i, err)
			}
			out, ok = offloaded(t, node, proto)
			if !ok {
				time.Sleep(20 * time.Millisecond)
			}
		}
		if !ok {
			t.Fatalf("%s: no offloaded conntrack entry after 50 round trips:\n%s\n%s", proto, out, node.MustRun(t, "", "nft", "list", "ruleset"))
		}
		t.Logf("%s offloaded: %s", proto, strings.TrimSpace(out))
		for i := 0; i < 20; i++ { // data still flows, on the fast path
			if err := roundTrip(c, fmt.Sprintf("%s-fast-%03d", proto, i)); err != nil {
				t.Fatalf("%s round trip %d on the fast path: %v", proto, i, err)
			}
		}
	}

	// The endpoint goes: the ruleset without it, then the conntrack cleanup, as a sync
	// does it (UDP: conntrack.Stale between the snapshots; the TCP entry by the same
	// filter, as nftproxy deletes connections after a repair).
	rs2, after := fastPathRuleset(0, "nd0", "nd1")
	if _, err := a.Apply(rs2); err != nil {
		t.Fatal(err)
	}
	flows := conntrack.Stale(before, after)
	if len(flows) == 0 {
		t.Fatalf("no stale UDP flow between the snapshots")
	}
	flows = append(flows, conntrack.Flow{Protocol: model.ProtoTCP, OrigDstIP: netip.MustParseAddr("10.96.0.10"), OrigDstPort: 80,
		ReplySrcIP: netip.MustParseAddr("10.244.0.1"), ReplySrcPort: 8080})
	var h *vnl.Handle
	if err := node.Do(func() (err error) { h, err = vnl.NewHandle(unix.NETLINK_NETFILTER); return err }); err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	n, err := (&conntrack.Cleaner{Deleter: h}).Clean(flows)
	if err != nil || n < 2 {
		t.Fatalf("conntrack cleanup deleted %d entries: %v", n, err)
	}
	// The flowtable's garbage collection runs every second; after it, no byte of
	// either flow may reach the endpoint.
	time.Sleep(2 * time.Second)
	tcpBefore, udpBefore := tcpGot.Load(), udpGot.Load()
	for i := 0; i < 10; i++ {
		_ = tc.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = tc.Write([]byte("stale-tcp"))
		_, _ = uc.Write([]byte("stale-udp"))
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	if d := tcpGot.Load() - tcpBefore; d != 0 {
		t.Errorf("%d TCP bytes reached the removed endpoint after its entry was deleted: a stale offloaded flow", d)
	}
	if d := udpGot.Load() - udpBefore; d != 0 {
		t.Errorf("%d UDP bytes reached the removed endpoint after its entry was deleted: a stale offloaded flow", d)
	}
	if out, ok := offloaded(t, node, "udp"); ok {
		t.Errorf("an offloaded UDP entry remains:\n%s", out)
	}
}

// TestFastPathFallback runs the proxy with --fast-path-interfaces on the node: on a
// kernel with flowtables the table has the fast path; on one without (this project's
// own development kernel) the refusal is logged once, the rest of the table is
// programmed all the same and the service answers, and no sync fails.
func TestFastPathFallback(t *testing.T) {
	client, node, ep := topology(t)
	var got atomic.Int64
	echoTCP(t, ep, &got)
	var mu sync.Mutex
	var lines []string
	log := funcr.New(func(prefix, args string) { mu.Lock(); lines = append(lines, prefix+" "+args); mu.Unlock() }, funcr.Options{Verbosity: 2})
	count := func(s string) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, l := range lines {
			if strings.Contains(l, s) {
				n++
			}
		}
		return n
	}
	a := kernel.New(kernel.WithNetNS(node.FD))
	supported := a.ProbeFlowtables(nft.IPv4) == nil && a.ProbeFlowtables(nft.IPv6) == nil

	cs := fake.NewClientset()
	ctx, cancel := context.WithCancel(context.Background())
	pname, port, proto := "http", int32(8080), v1.ProtocolTCP
	for _, o := range []any{
		&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}},
		&v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"}, Spec: v1.ServiceSpec{
			Type: v1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}}},
		&discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-1", Labels: map[string]string{discovery.LabelServiceName: "web"}},
			AddressType: discovery.AddressTypeIPv4, Ports: []discovery.EndpointPort{{Name: &pname, Port: &port, Protocol: &proto}},
			Endpoints: []discovery.Endpoint{{Addresses: []string{"10.244.0.1"}}}},
	} {
		var err error
		switch o := o.(type) {
		case *v1.Node:
			_, err = cs.CoreV1().Nodes().Create(ctx, o, metav1.CreateOptions{})
		case *v1.Service:
			_, err = cs.CoreV1().Services(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *discovery.EndpointSlice:
			_, err = cs.DiscoveryV1().EndpointSlices(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	interfaces := func() ([]string, error) {
		var names []string
		err := node.Do(func() error {
			ifs, err := net.Interfaces()
			for _, i := range ifs {
				names = append(names, i.Name)
			}
			return err
		})
		return names, err
	}
	p := controller.New(cs, a, controller.Config{NodeName: "node-1", MinSyncPeriod: 10 * time.Millisecond,
		SyncPeriod: time.Hour, Pipeline: pipeline.Config{
			Compile: compile.Config{MasqueradeBit: 14,
				DetectLocal: compile.DetectLocal{Mode: compile.LocalClusterCIDR, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}},
				Policy:      admit.Policy{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}},
			FastPathInterfaces: []string{"nd*"}, Interfaces: interfaces}}, logr.Logger(log))
	done := make(chan struct{})
	go func() { _ = p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-p.Synced():
	case <-time.After(30 * time.Second):
		t.Fatalf("no sync succeeded:\n%s", strings.Join(lines, "\n"))
	}
	// a later sync (a new Service) must neither probe nor fail again
	other := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "other"}, Spec: v1.ServiceSpec{
		Type: v1.ServiceTypeClusterIP, ClusterIP: "10.96.0.11", ClusterIPs: []string{"10.96.0.11"},
		Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}}}
	if _, err := cs.CoreV1().Services("default").Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(node.MustRun(t, "", "nft", "list", "table", "ip", "nftproxy"), "10.96.0.11") {
		if time.Now().After(deadline) {
			t.Fatalf("the new Service never reached the kernel")
		}
		time.Sleep(20 * time.Millisecond)
	}
	list := node.MustRun(t, "", "nft", "list", "table", "ip", "nftproxy")
	refusals := count("cannot create nf_tables flowtables")
	switch {
	case supported && (!strings.Contains(list, "flow add @fastpath") || !strings.Contains(list, "devices = { nd0, nd1 }")):
		t.Errorf("a kernel with flowtables: the table lacks the fast path:\n%s", list)
	case supported && refusals != 0:
		t.Errorf("a kernel with flowtables: %d refusals logged", refusals)
	case !supported && refusals != 1:
		t.Errorf("a kernel without flowtables: the refusal was logged %d times, want once:\n%s", refusals, strings.Join(lines, "\n"))
	case !supported && strings.Contains(list, "flowtable"):
		t.Errorf("a kernel without flowtables: the table has one:\n%s", list)
	}
	if n := count("Sync failed"); n != 0 {
		t.Errorf("%d syncs failed:\n%s", n, strings.Join(lines, "\n"))
	}
	if !supported {
		evs, _ := cs.CoreV1().Events("").List(ctx, metav1.ListOptions{})
		found := false
		for _, e := range evs.Items {
			found = found || e.Reason == "NftproxyFastPathUnavailable" && e.InvolvedObject.Kind == "Node"
		}
		if !found {
			t.Errorf("no NftproxyFastPathUnavailable event on the Node: %d events", len(evs.Items))
		}
	}
	// the service answers
	ok := false
	for i := 0; i < 3 && !ok; i++ {
		c, err := client.DialTCP("192.168.1.2", "10.96.0.10", 80)
		if err != nil {
			continue
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = c.Write([]byte("hello\n"))
		line, err := bufio.NewReader(c).ReadString('\n')
		c.Close()
		ok = err == nil && line == "hello\n"
	}
	if !ok {
		t.Errorf("the service does not answer through the ClusterIP")
	}
	t.Logf("flowtables supported: %v; refusals logged: %d", supported, refusals)
}

// TestFastPathThroughput measures one long-lived TCP connection through the ClusterIP,
// client → node → endpoint over veth, in FASTPATH_ROUNDS (default 2) pairs of intervals
// of FASTPATH_SECONDS (default 5) without and with the fast path, and the machine's CPU time per GB moved (/proc/stat: all CPUs busy,
// so sender, receiver and the forwarding node together). It asserts nothing about speed;
// it prints the figure docs/semantics.md quotes. Run only with NFTPROXY_FASTPATH_FIGURE=1.
func TestFastPathThroughput(t *testing.T) {
	if os.Getenv("NFTPROXY_FASTPATH_FIGURE") != "1" {
		t.Skip("a measurement, not a test: NFTPROXY_FASTPATH_FIGURE=1 runs it")
	}
	secs := 5
	if s, err := strconv.Atoi(os.Getenv("FASTPATH_SECONDS")); err == nil && s > 0 {
		secs = s
	}
	client, node, ep := topology(t)
	a := kernel.New(kernel.WithNetNS(node.FD))
	requireFlowtables(t, a)
	// a sink: the endpoint reads and discards
	var l net.Listener
	if err := ep.Do(func() (err error) { l, err = net.Listen("tcp4", "10.244.0.1:8080"); return err }); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	type sum struct {
		bytes, jiffies int64
		secs           float64
	}
	results := map[bool]*sum{false: {}, true: {}}
	name := map[bool]string{false: "conntrack and rules (no fast path)", true: "fast path"}
	// alternating, FASTPATH_ROUNDS (default 2) pairs: the machine may be shared, and
	// the ratio of each pair is taken on neighbouring intervals
	rounds := 2
	if s, err := strconv.Atoi(os.Getenv("FASTPATH_ROUNDS")); err == nil && s > 0 {
		rounds = s
	}
	var order []bool
	for range rounds {
		order = append(order, false, true)
	}
	var ratios, last []float64 // per pair: fast/slow throughput
	for _, fast := range order {
		var devs []string
		if fast {
			devs = []string{"nd0", "nd1"}
		}
		a.Resync()
		rs, _ := fastPathRuleset(1, devs...)
		if _, err := a.Apply(rs); err != nil {
			t.Fatal(err)
		}
		c, err := client.DialTCP("192.168.1.2", "10.96.0.10", 80)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 128<<10)
		// warm up: the flow is established (and offloaded) before the measurement
		for i := 0; i < 20; i++ {
			_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
			_, _ = c.Write(buf)
		}
		if _, off := offloaded(t, node, "tcp"); off != fast {
			t.Fatalf("%s: offloaded %v", name[fast], off)
		}
		busy0, total0 := procStat(t)
		start := time.Now()
		var sent int64
		end := start.Add(time.Duration(secs) * time.Second)
		for time.Now().Before(end) {
			_ = c.SetWriteDeadline(end.Add(time.Second))
			n, err := c.Write(buf)
			sent += int64(n)
			if err != nil {
				break
			}
		}
		took := time.Since(start)
		busy1, total1 := procStat(t)
		_, off := offloaded(t, node, "tcp")
		c.Close()
		r := results[fast]
		r.bytes, r.jiffies, r.secs = r.bytes+sent, r.jiffies+busy1-busy0, r.secs+took.Seconds()
		gb := float64(sent) / 1e9
		if !fast {
			last = []float64{gb / took.Seconds()}
		} else if len(last) == 1 {
			ratios = append(ratios, gb/took.Seconds()/last[0])
		}
		t.Logf("%s: %.3f Gbit/s (%d bytes in %v), %.1f CPU-seconds per GB (%.0f %% of %d CPU busy), still offloaded: %v",
			name[fast], gb*8/took.Seconds(), sent, took.Round(time.Millisecond), float64(busy1-busy0)/100/gb,
			100*float64(busy1-busy0)/float64(total1-total0), ncpu(t), off)
	}
	rate := func(r *sum) float64 { return float64(r.bytes) * 8 / 1e9 / r.secs }
	perGB := func(r *sum) float64 { return float64(r.jiffies) / 100 / (float64(r.bytes) / 1e9) } // USER_HZ
	slow, fast := results[false], results[true]
	slices.Sort(ratios)
	median := ratios[len(ratios)/2]
	if len(ratios)%2 == 0 {
		median = (ratios[len(ratios)/2-1] + median) / 2
	}
	t.Logf("no fast path: %.3f Gbit/s, %.1f CPU-s/GB; fast path: %.3f Gbit/s, %.1f CPU-s/GB; fast/slow: throughput ×%.2f, CPU per GB ×%.2f; per pair throughput ratios %.2f (median %.2f)",
		rate(slow), perGB(slow), rate(fast), perGB(fast), rate(fast)/rate(slow), perGB(fast)/perGB(slow), ratios, median)
}

// procStat returns the busy and total jiffies of all CPUs.
func procStat(t *testing.T) (busy, total int64) {
	t.Helper()
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(strings.SplitN(string(b), "\n", 2)[0]) // cpu user nice system idle iowait irq softirq steal …
	for i, s := range f[1:] {
		v, _ := strconv.ParseInt(s, 10, 64)
		if i >= 8 {
			break // guest, guest_nice are in user already
		}
		total += v
		if i != 3 && i != 4 {
			busy += v
		}
	}
	return busy, total
}

func ncpu(t *testing.T) int {
	b, _ := os.ReadFile("/proc/stat")
	return strings.Count(string(b), "\ncpu")
}
