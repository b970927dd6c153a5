package shapes

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/vishvananda/netns"
)

// inNS runs f on a thread switched into the namespace of fd. Sockets f creates stay in
// that namespace. A thread that cannot be switched back is never reused.
func inNS(fd int, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(netns.NsHandle(fd)); err != nil {
			errc <- err
			return
		}
		err = f()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// topology is a client namespace, a node namespace holding the ruleset and routing, and an
// endpoints namespace with the backends' addresses:
//
//	client 192.168.1.2 ── 192.168.1.1 node 192.168.2.1 ── 192.168.2.2 endpoints (10.1.0.1-3)
type topology struct {
	client, node, eps *testnetns.NS
}

func newTopology(t *testing.T) *topology {
	tp := &topology{client: testnetns.New(t), node: testnetns.New(t), eps: testnetns.New(t)}
	n := tp.node
	n.MustRun(t, "", "ip", "link", "add", "nd0", "type", "veth", "peer", "name", "cl0", "netns", tp.client.Name)
	n.MustRun(t, "", "ip", "link", "add", "nd1", "type", "veth", "peer", "name", "ep0", "netns", tp.eps.Name)
	for _, c := range [][]string{
		{"ip", "addr", "add", "192.168.1.1/24", "dev", "nd0"},
		{"ip", "addr", "add", "192.168.2.1/24", "dev", "nd1"},
		{"ip", "link", "set", "nd0", "up"},
		{"ip", "link", "set", "nd1", "up"},
		{"ip", "link", "set", "lo", "up"},
		{"ip", "route", "add", "10.1.0.0/24", "via", "192.168.2.2"},
		// A default route, as a node has: a service address is forwarded, not unroutable.
		{"ip", "route", "add", "default", "via", "192.168.2.2"},
		{"sysctl", "-qw", "net.ipv4.ip_forward=1"},
	} {
		n.MustRun(t, "", c...)
	}
	for _, c := range [][]string{
		{"ip", "addr", "add", "192.168.1.2/24", "dev", "cl0"},
		{"ip", "link", "set", "cl0", "up"},
		{"ip", "link", "set", "lo", "up"},
		{"ip", "route", "add", "default", "via", "192.168.1.1"},
	} {
		tp.client.MustRun(t, "", c...)
	}
	for _, c := range [][]string{
		{"ip", "addr", "add", "192.168.2.2/24", "dev", "ep0"},
		{"ip", "addr", "add", "10.1.0.1/32", "dev", "ep0"},
		{"ip", "addr", "add", "10.1.0.2/32", "dev", "ep0"},
		{"ip", "addr", "add", "10.1.0.3/32", "dev", "ep0"},
		{"ip", "link", "set", "ep0", "up"},
		{"ip", "link", "set", "lo", "up"},
		{"ip", "route", "add", "default", "via", "192.168.2.1"},
	} {
		tp.eps.MustRun(t, "", c...)
	}
	// Backends: each answers with the address it was reached on and the peer it saw.
	for _, a := range []string{"10.1.0.1:8080", "10.1.0.2:8080", "10.1.0.3:8080"} {
		var l net.Listener
		if err := inNS(tp.eps.FD, func() (err error) { l, err = net.Listen("tcp", a); return err }); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				fmt.Fprintf(c, "%s %s\n", c.LocalAddr(), c.RemoteAddr().(*net.TCPAddr).IP)
				c.Close()
			}
		}()
	}
	return tp
}

// connect makes count connections (bounded: each with a 2 s timeout) from the client to
// addr and returns how many each backend answered, by backend address, and the source
// addresses the backends saw.
func (tp *topology) connect(t *testing.T, addr string, count int) (map[string]int, map[string]int) {
	t.Helper()
	byBackend, bySource := map[string]int{}, map[string]int{}
	err := inNS(tp.client.FD, func() error {
		for i := 0; i < count; i++ {
			c, err := net.DialTimeout("tcp", addr, 2*time.Second)
			if err != nil {
				return fmt.Errorf("connection %d to %s: %w", i, addr, err)
			}
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			line, err := bufio.NewReader(c).ReadString('\n')
			c.Close()
			if err != nil {
				return fmt.Errorf("connection %d to %s: reading: %w", i, addr, err)
			}
			f := strings.Fields(line)
			byBackend[f[0]]++
			bySource[f[1]]++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return byBackend, bySource
}

// refused dials addr once from the client and reports whether it was refused at once.
func (tp *topology) refused(t *testing.T, addr string) bool {
	var err error
	if e := inNS(tp.client.FD, func() error {
		var c net.Conn
		c, err = net.DialTimeout("tcp", addr, 2*time.Second)
		if err == nil {
			c.Close()
		}
		return nil
	}); e != nil {
		t.Fatal(e)
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}

// TestPackets checks each candidate with real connections: a service with 3 endpoints
// gets ≥ 300 connections spread over all 3, masqueraded (the client is outside the
// cluster CIDR); a service without endpoints is refused; then element-only changes on
// the live table: the count drops to 2 (the third endpoint gets nothing more), and a
// service added by elements alone answers.
func TestPackets(t *testing.T) {
	for _, shape := range Shapes {
		t.Run(shape, func(t *testing.T) {
			tp := newTopology(t)
			svcs := Services(20, 2)
			for i := range svcs {
				svcs[i].Endpoints = svcs[i].Endpoints[:1+i%2] // classes 1 and 2 in use besides 3
			}
			backends := []Endpoint{{netip.MustParseAddr("10.1.0.1"), 8080}, {netip.MustParseAddr("10.1.0.2"), 8080}, {netip.MustParseAddr("10.1.0.3"), 8080}}
			svcs[1].Endpoints = backends // 10.96.0.1
			svcs[2].Endpoints = nil      // 10.96.0.2
			tp.node.MustRun(t, Generate(shape, svcs, classes1To(4)), "nft", "-f", "-")

			const n = 300
			got, src := tp.connect(t, "10.96.0.1:80", n)
			t.Logf("%d connections: backends %v, sources %v", n, got, src)
			for _, b := range backends {
				// Uniform over 3: each expects 100; below 60 has probability < 1e-6.
				if c := got[fmt.Sprintf("%s:%d", b.Addr, b.Port)]; c < 60 {
					t.Errorf("backend %s answered %d of %d connections", b.Addr, c, n)
				}
			}
			if len(got) != 3 || src["192.168.2.1"] != n {
				t.Errorf("want 3 backends and every connection masqueraded to 192.168.2.1: %v %v", got, src)
			}
			if !tp.refused(t, "10.96.0.2:80") {
				t.Errorf("a service without endpoints is not refused")
			}

			c, err := Dial(tp.node.FD)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			two := svcs[1]
			two.Endpoints = backends[:2]
			if _, err := c.Apply(Resize(shape, svcs[1], two)); err != nil {
				t.Fatal(err)
			}
			got, _ = tp.connect(t, "10.96.0.1:80", 200)
			t.Logf("after the count went to 2: %v", got)
			if len(got) != 2 || got["10.1.0.1:8080"] < 40 || got["10.1.0.2:8080"] < 40 {
				t.Errorf("want 200 connections over 10.1.0.1 and .2 only: %v", got)
			}
			added := Service{IP: netip.MustParseAddr("10.96.1.1"), Port: 80, Endpoints: backends[2:]}
			if _, err := c.Apply(AddService(shape, added)); err != nil {
				t.Fatal(err)
			}
			if got, _ = tp.connect(t, "10.96.1.1:80", 20); got["10.1.0.3:8080"] != 20 {
				t.Errorf("added service: %v", got)
			}
			if _, err := c.Apply(RemoveService(shape, added)); err != nil {
				t.Fatal(err)
			}
			// Removed: no DNAT any more, and the address is routed nowhere (bounded by the timeout).
			if err := inNS(tp.client.FD, func() error {
				c, err := net.DialTimeout("tcp", "10.96.1.1:80", 500*time.Millisecond)
				if err == nil {
					c.Close()
					return errors.New("removed service still answers")
				}
				return nil
			}); err != nil {
				t.Error(err)
			}
			// What nft prints, nft reads back (in an empty namespace: nft 1.0.6 refuses to
			// re-evaluate a listed "dnat … map" rule against a kernel cache holding the same
			// table, "conflicting protocols specified: tcp vs. th", for today's ruleset too).
			list := tp.node.MustRun(t, "", "nft", "list", "table", "ip", Table)
			testnetns.New(t).MustRun(t, list, "nft", "-c", "-f", "-")
		})
	}
}

// TestAffinity checks ClientIP affinity through the shared affinity map: every one of
// 300 connections from one client reaches the same endpoint; once that endpoint is gone
// (count 3 → 2, its pinned clients forgotten) the client is pinned to one of the others;
// and with a 5 s timeout, the pin expires.
func TestAffinity(t *testing.T) {
	for _, shape := range Shapes {
		t.Run(shape, func(t *testing.T) {
			tp := newTopology(t)
			backends := []Endpoint{{netip.MustParseAddr("10.1.0.1"), 8080}, {netip.MustParseAddr("10.1.0.2"), 8080}, {netip.MustParseAddr("10.1.0.3"), 8080}}
			svcs := Services(4, 1)
			svcs[1].Endpoints, svcs[1].Affinity = backends, 5 // 10.96.0.1
			svcs[3].Endpoints = backends                      // 10.96.0.3, no affinity
			tp.node.MustRun(t, Generate(shape, svcs, classes1To(4)), "nft", "-f", "-")

			got, _ := tp.connect(t, "10.96.0.1:80", 300)
			t.Logf("affinity, 300 connections: %v", got)
			if len(got) != 1 {
				t.Fatalf("want every connection on one endpoint: %v", got)
			}
			var pinned string
			for b := range got {
				pinned = b
			}
			if got, _ := tp.connect(t, "10.96.0.3:80", 60); len(got) < 2 {
				t.Errorf("a service without affinity is pinned too: %v", got)
			}

			c, err := Dial(tp.node.FD)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			next := svcs[1]
			next.Endpoints = nil
			var gone []Endpoint
			for _, b := range backends {
				if fmt.Sprintf("%s:%d", b.Addr, b.Port) == pinned {
					gone = append(gone, b)
				} else {
					next.Endpoints = append(next.Endpoints, b)
				}
			}
			ops := Resize(shape, svcs[1], next)
			stale, err := c.StaleAffinity(svcs[1], gone)
			if err != nil || len(stale) != 1 || len(stale[0].Elements) != 1 {
				t.Fatalf("want the client's one affinity entry to %s: %v %v", pinned, stale, err)
			}
			if _, err := c.Apply(append(ops, stale...)); err != nil {
				t.Fatal(err)
			}
			got, _ = tp.connect(t, "10.96.0.1:80", 100)
			t.Logf("after %s went away: %v", pinned, got)
			if len(got) != 1 || got[pinned] != 0 {
				t.Fatalf("want the client pinned to one remaining endpoint: %v", got)
			}
			// Expiry: 5 s after its last new connection the entry is gone (bounded wait).
			time.Sleep(6 * time.Second)
			if left, err := c.c.GetSetElements(&nftables.Set{Table: c.table, Name: "affinity", IsMap: true}); err != nil || len(left) != 0 {
				t.Errorf("affinity entries after the timeout: %d (%v)", len(left), err)
			}
		})
	}
}

// TestNodePort checks markclass's node ports: 300 connections from the client to the
// node's address at the node port reach all 3 endpoints, masqueraded (externalTraffic-
// Policy Cluster); the cluster IP of the same service still works; an element-only count
// change 3 → 2 applies to both frontends; an endpoint swap reaches the node port's map.
func TestNodePort(t *testing.T) {
	tp := newTopology(t)
	backends := []Endpoint{{netip.MustParseAddr("10.1.0.1"), 8080}, {netip.MustParseAddr("10.1.0.2"), 8080}, {netip.MustParseAddr("10.1.0.3"), 8080}}
	svcs := Services(4, 2)
	svcs[1].Endpoints, svcs[1].NodePort = backends, 30080 // 10.96.0.1
	svcs[2].NodePort = 30081                              // 2 endpoints that do not answer: another class
	tp.node.MustRun(t, Generate(MarkClass, svcs, classes1To(4)), "nft", "-f", "-")

	got, src := tp.connect(t, "192.168.1.1:30080", 300)
	t.Logf("node port, 300 connections: %v, sources %v", got, src)
	if len(got) != 3 || src["192.168.2.1"] != 300 {
		t.Errorf("want 3 endpoints and every connection masqueraded: %v %v", got, src)
	}
	for b, c := range got {
		if c < 60 {
			t.Errorf("endpoint %s answered %d of 300", b, c)
		}
	}
	if got, _ := tp.connect(t, "10.96.0.1:80", 30); len(got) < 2 {
		t.Errorf("cluster IP of the node-port service: %v", got)
	}

	c, err := Dial(tp.node.FD)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	two := svcs[1]
	two.Endpoints = backends[:2]
	if _, err := c.Apply(Resize(MarkClass, svcs[1], two)); err != nil {
		t.Fatal(err)
	}
	got, _ = tp.connect(t, "192.168.1.1:30080", 100)
	if len(got) != 2 || got["10.1.0.3:8080"] != 0 {
		t.Errorf("node port after the count went to 2: %v", got)
	}
	if _, err := c.Apply(ReplaceEndpoint(MarkClass, two, 0, backends[2])); err != nil {
		t.Fatal(err)
	}
	got, _ = tp.connect(t, "192.168.1.1:30080", 100)
	t.Logf("node port after 10.1.0.1 was replaced by 10.1.0.3: %v", got)
	if len(got) != 2 || got["10.1.0.1:8080"] != 0 {
		t.Errorf("node port after the swap: %v", got)
	}
	list := tp.node.MustRun(t, "", "nft", "list", "table", "ip", Table)
	testnetns.New(t).MustRun(t, list, "nft", "-c", "-f", "-")
}
