package inspect

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/internal/testrules"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
	"github.com/nftproxy/nftproxy/nft/readback"
	"github.com/nftproxy/nftproxy/nft/wire"
)

// listPort returns testrules.Service with its endpoints on node-2.
func listPort(name, clusterIP string, nodePort uint16, first, n int) model.ServicePort {
	sp := testrules.Service(name, clusterIP, nodePort, first, n)
	for i := range sp.Endpoints {
		sp.Endpoints[i].NodeName = "node-2"
	}
	return sp
}

// listSnapshot has a plain service with a node port, ClientIP affinity over three
// endpoints, a load balancer with an external IP, source ranges and the Local policy (one
// of its endpoints on this node), a service without endpoints and a UDP service.
func listSnapshot() *model.Snapshot {
	plain := listPort("plain", "10.96.0.1", 30080, 0, 2)
	sticky := listPort("sticky", "10.96.0.2", 0, 10, 3)
	sticky.AffinityTimeout = 10800
	lb := listPort("lb", "10.96.0.3", 30443, 20, 3)
	lb.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.51.100.1")}
	lb.ExternalIPs = []netip.Addr{netip.MustParseAddr("203.0.113.7")}
	lb.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
	lb.ExternalPolicyLocal = true
	lb.Endpoints[1].NodeName = "node-1"
	empty := listPort("empty", "10.96.0.4", 0, 0, 0)
	dns := listPort("dns", "10.96.0.10", 0, 30, 1)
	dns.Name.Protocol, dns.Name.Port, dns.Port = model.ProtoUDP, "", 53
	return &model.Snapshot{
		Node:     model.Node{Name: "node-1", IPs: []netip.Addr{netip.MustParseAddr("192.0.2.10")}},
		Services: model.Ports([]model.ServicePort{plain, sticky, lb, empty, dns}),
	}
}

func listConfig() compile.Config { return testrules.Config() }

// wantList is the listing of listSnapshot. The load balancer admits its own address as
// a source too: the node (192.0.2.10) is in the source range and reaches a VIP it holds
// from that VIP.
const wantList = `SERVICE              PROTO  FRONTEND         TYPE       POLICY   AFFINITY         ENDPOINTS
default/dns          udp    10.96.0.10:53    ClusterIP  Cluster  -                10.244.0.31:8080 100.0%
default/empty:http   tcp    10.96.0.4:80     ClusterIP  -        -                (none: rejected)
default/lb:http      tcp    10.96.0.3:80     ClusterIP  Cluster  -                10.244.0.21:8080 33.3%
                                                                                  10.244.0.22:8080 33.3%
                                                                                  10.244.0.23:8080 33.3%
default/lb:http      tcp    198.51.100.1:80  External   Local    -                10.244.0.22:8080 100.0% local
                                                                                  (source ranges: 192.0.2.0/24,198.51.100.1/32)
default/lb:http      tcp    203.0.113.7:80   External   Local    -                10.244.0.22:8080 100.0% local
default/lb:http      tcp    *:30443          NodePort   Local    -                10.244.0.22:8080 100.0% local
default/plain:http   tcp    10.96.0.1:80     ClusterIP  Cluster  -                10.244.0.1:8080 50.0%
                                                                                  10.244.0.2:8080 50.0%
default/plain:http   tcp    *:30080          NodePort   Cluster  -                10.244.0.1:8080 50.0%
                                                                                  10.244.0.2:8080 50.0%
default/sticky:http  tcp    10.96.0.2:80     ClusterIP  Cluster  ClientIP 10800s  10.244.0.11:8080 33.3%
                                                                                  10.244.0.12:8080 33.3%
                                                                                  10.244.0.13:8080 33.3%
`

// encodedTables reads back what a ruleset encodes to, without a kernel.
type encodedTables map[nft.Family]*nft.Ruleset

func (e encodedTables) ReadBack(fam nft.Family, table string) (*wire.TableState, error) {
	rs := e[fam]
	if rs == nil || rs.Table != table {
		return &wire.TableState{Family: fam, Name: table}, nil
	}
	return wire.EncodeState(rs)
}

// families are the families nftproxy programs.
var families = []nft.Family{nft.IPv4, nft.IPv6}

// listed lists r's tables, failing the test on an error or an ignored rule.
func listed(t *testing.T, r TableReader) Listing {
	t.Helper()
	l, err := List(r, families, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Ignored) != 0 {
		t.Errorf("ignored: %q", l.Ignored)
	}
	return l
}

// table is the text listing of l.
func table(t *testing.T, l Listing) string {
	t.Helper()
	var out bytes.Buffer
	if err := WriteTable(&out, l.Ports); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// viaJSON is l's service ports as their JSON reads back.
func viaJSON(t *testing.T, l Listing) []Port {
	t.Helper()
	b, err := json.Marshal(l.Ports)
	if err != nil {
		t.Fatal(err)
	}
	var ports []Port
	if err := json.Unmarshal(b, &ports); err != nil {
		t.Fatalf("json: %v\n%s", err, b)
	}
	return ports
}

// TestListFormat lists the encoding of a compiled ruleset: the aligned table, and the
// same in JSON.
func TestListFormat(t *testing.T) {
	rs, _ := compile.Compile(listSnapshot(), listConfig(), compile.NewSlots())
	l := listed(t, encodedTables{nft.IPv4: rs})
	if l.Tables != 1 {
		t.Errorf("%d tables found, want 1", l.Tables)
	}
	if got := table(t, l); got != wantList {
		t.Errorf("listing:\n%s\nwant:\n%s", got, wantList)
	}

	ports := viaJSON(t, l)
	if len(ports) != 5 || ports[2].Service != "default/lb:http" || len(ports[2].Frontends) != 4 {
		t.Fatalf("json: %+v", ports)
	}
	lbIP := ports[2].Frontends[1]
	if lbIP.Type != "External" || lbIP.Address != "198.51.100.1" || lbIP.Port != 80 || lbIP.Action != "dnat" || lbIP.TrafficPolicy != "Local" ||
		len(lbIP.SourceRanges) != 2 || lbIP.SourceRanges[0] != "192.0.2.0/24" ||
		len(lbIP.Endpoints) != 1 || lbIP.Endpoints[0] != (Endpoint{Address: "10.244.0.22:8080", Probability: 1, Local: true}) {
		t.Errorf("json load-balancer frontend: %+v", lbIP)
	}
	if f := ports[4].Frontends[0]; f.AffinityTimeoutSeconds != 10800 || len(f.Endpoints) != 3 || f.Endpoints[0].Probability != 0.333333 {
		t.Errorf("json affinity frontend: %+v", f)
	}

	// no table: none found, nothing listed
	if l := listed(t, encodedTables{}); l.Tables != 0 || len(l.Ports) != 0 {
		t.Errorf("no table: %+v", l)
	}
}

// TestListKernel programs the compiled rulesets of both families in a throwaway network
// namespace and lists them from the kernel, and lists again after a service lost its
// endpoints: the listing shows what is programmed.
func TestListKernel(t *testing.T) {
	ns := testnetns.New(t)
	a := kernel.New(kernel.WithNetNS(ns.FD))
	slots := compile.NewSlots()
	snap := listSnapshot()
	rs, _ := compile.Compile(snap, listConfig(), slots)
	if _, err := a.Apply(rs); err != nil {
		t.Fatal(err)
	}
	if got := table(t, listed(t, readback.Reader{NetNS: ns.FD})); got != wantList {
		t.Errorf("listing from the kernel:\n%s\nwant:\n%s", got, wantList)
	}

	// the plain service loses its endpoints; an IPv6 table appears
	snap.Services[0].Endpoints = nil
	rs, _ = compile.Compile(snap, listConfig(), slots)
	six := model.ServicePort{
		Name:       model.ServicePortName{Namespace: "default", Name: "v6", Protocol: model.ProtoTCP},
		ClusterIPs: []netip.Addr{netip.MustParseAddr("fd00:96::1")},
		Port:       443,
		Endpoints:  []model.Endpoint{{Addr: netip.MustParseAddr("fd00:244::5"), Port: 8443, Ready: true, Serving: true}},
	}
	rs6, _ := compile.Compile(&model.Snapshot{Node: snap.Node, Services: model.Ports([]model.ServicePort{six})},
		compile.Config{Family: nft.IPv6, DetectLocal: compile.DetectLocal{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("fd00:244::/56")}}, MasqueradeBit: 14}, compile.NewSlots())
	for _, r := range []*nft.Ruleset{rs, rs6} {
		if _, err := a.Apply(r); err != nil {
			t.Fatal(err)
		}
	}
	l := listed(t, readback.Reader{NetNS: ns.FD})
	if l.Tables != 2 {
		t.Errorf("%d tables found, want 2", l.Tables)
	}
	out := table(t, l)
	var lines []string // columns single-spaced: the IPv6 address widens them
	for _, l := range strings.Split(out, "\n") {
		lines = append(lines, strings.Join(strings.Fields(l), " "))
	}
	for _, want := range []string{
		"default/plain:http tcp 10.96.0.1:80 ClusterIP - - (none: rejected)",
		"default/plain:http tcp *:30080 NodePort - - (none: rejected)",
		"default/v6 tcp [fd00:96::1]:443 ClusterIP Cluster - [fd00:244::5]:8443 100.0%",
	} {
		if !slices.Contains(lines, want) {
			t.Errorf("no line %q in\n%s", want, out)
		}
	}
	if strings.Contains(out, "10.244.0.1:8080") {
		t.Errorf("endpoints no longer programmed still listed:\n%s", out)
	}
}

// TestListFlatMissingEntry: a flat frontend's count comes from the count-bit sets, which
// the lb chains read; an index below it without an endpoint entry is listed, not hidden.
func TestListFlatMissingEntry(t *testing.T) {
	rs, _ := compile.Compile(listSnapshot(), listConfig(), compile.NewSlots())
	rs = rs.Flatten()
	for _, s := range rs.Sets {
		if s.Name == compile.MapEndpoints {
			s.Elements = slices.DeleteFunc(s.Elements, func(e nft.Element) bool {
				return e.Key[0].Addr() == netip.MustParseAddr("10.96.0.1") && e.Key[3].Num() == 1
			})
		}
	}
	out := table(t, listed(t, encodedTables{nft.IPv4: rs}))
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		lines = append(lines, strings.Join(strings.Fields(l), " "))
	}
	for _, want := range []string{"default/plain:http tcp 10.96.0.1:80 ClusterIP Cluster - (missing slot 1) 50.0%", "10.244.0.1:8080 50.0%"} {
		if !slices.Contains(lines, want) {
			t.Errorf("no line %q in\n%s", want, out)
		}
	}
}

// TestListShowsWhoWinsANodePort: the tenant's externalIP is the node's address
// (192.0.2.10) on the port that is the victim's node port. list shows, from the table's
// rules, which of the two frontends the kernel sends new connections to there, and
// marks the other: as compiled, and with the services chain's node-port rules moved
// ahead of the frontend rules (node ports then win on node addresses).
func TestListShowsWhoWinsANodePort(t *testing.T) {
	victim := listPort("web", "10.96.0.1", 30080, 0, 2)
	victim.Name.Namespace = "victim"
	tenant := listPort("x", "10.96.0.2", 0, 10, 1)
	tenant.Name.Namespace = "tenant"
	tenant.Port = 30080
	tenant.ExternalIPs = []netip.Addr{netip.MustParseAddr("192.0.2.10")}
	tenant.Created = victim.Created.Add(time.Hour)
	snap := &model.Snapshot{
		Node:     model.Node{Name: "node-1", IPs: []netip.Addr{netip.MustParseAddr("192.0.2.10")}},
		Services: model.Ports([]model.ServicePort{victim, tenant}),
	}
	// The compiler refuses an externalIP on a node address at another Service's node
	// port, so nothing is shadowed in what it writes.
	compiled, _ := compile.Compile(snap, listConfig(), compile.NewSlots())
	list := func(rs *nft.Ruleset) map[string]Frontend {
		t.Helper()
		got := map[string]Frontend{}
		for _, p := range viaJSON(t, listed(t, encodedTables{nft.IPv4: rs})) {
			for _, f := range p.Frontends {
				got[p.Service+" "+f.Type+" "+f.Address] = f
			}
		}
		return got
	}
	nodePort, external := "victim/web:http NodePort ", "tenant/x:http External 192.0.2.10"
	onNode := []Shadow{{Address: "192.0.2.10", By: "tenant/x:http", ByType: "External"}}
	byNodePort := []Shadow{{Address: "192.0.2.10", By: "victim/web:http", ByType: "NodePort"}}

	got := list(compiled)
	t.Logf("as compiled:\n%s", table(t, listed(t, encodedTables{nft.IPv4: compiled})))
	if _, programmed := got[external]; programmed {
		t.Errorf("as compiled: the externalIP on the node address at the victim's node port is programmed")
	}
	if got[nodePort].Shadowed != nil {
		t.Errorf("as compiled (the externalIP refused): node port shadowed on %+v", got[nodePort].Shadowed)
	}

	// A table where they do meet (written by an older nftproxy, or by hand): compiled
	// for a node at another address, with the externalIP's address added to the
	// addresses node ports answer on. External frontends come first in the services
	// chain, so the externalIP takes the node port there.
	met := func() *nft.Ruleset {
		other, cfg := *snap, listConfig()
		other.Node.IPs = []netip.Addr{netip.MustParseAddr("192.0.2.99")}
		cfg.NodePortAddrs = other.Node.IPs
		rs, _ := compile.Compile(&other, cfg, compile.NewSlots())
		for _, s := range rs.Sets {
			if s.Name == compile.SetNodePortIPs {
				s.Elements = append(s.Elements, nft.Element{Key: []nft.Value{nft.Addr(netip.MustParseAddr("192.0.2.10"))}})
			}
		}
		return rs
	}
	got = list(met())
	if !slices.Equal(got[nodePort].Shadowed, onNode) || got[external].Shadowed != nil {
		t.Errorf("external frontends first: node port shadowed on %+v, external on %+v; want the node port shadowed on 192.0.2.10",
			got[nodePort].Shadowed, got[external].Shadowed)
	}

	// the same elements, node-port rules first: the node port wins on its addresses
	rs := met()
	for _, c := range rs.Chains {
		if c.Name != compile.ChainServices {
			continue
		}
		var port, other []nft.Rule
		for _, r := range c.Rules {
			if slices.ContainsFunc(r.Stmts, func(s nft.Stmt) bool { l, ok := s.(nft.Lookup); return ok && l.Set == compile.SetNodePortIPs }) {
				port = append(port, r)
			} else {
				other = append(other, r)
			}
		}
		if len(port) == 0 {
			t.Fatal("no node-port rule in the services chain")
		}
		c.Rules = append(port, other...)
	}
	got = list(rs)
	if !slices.Equal(got[external].Shadowed, byNodePort) || got[nodePort].Shadowed != nil {
		t.Errorf("node-port rules first: external shadowed on %+v, node port on %+v; want the external shadowed by the node port",
			got[external].Shadowed, got[nodePort].Shadowed)
	}
	if out := table(t, listed(t, encodedTables{nft.IPv4: rs})); !strings.Contains(out, "(shadowed: victim/web:http takes it, NodePort)") {
		t.Errorf("text listing lacks the shadow:\n%s", out)
	}

	// node ports on every local address ("fib daddr type local"): the node's addresses
	// are what List is given; the externalIP takes the node port on them, and nothing
	// is shadowed where the node has no such address
	other, cfg := *snap, listConfig()
	other.Node.IPs = []netip.Addr{netip.MustParseAddr("192.0.2.99")}
	cfg.NodePortAddrs, cfg.NodePortAllLocal = nil, true
	allLocal, _ := compile.Compile(&other, cfg, compile.NewSlots())
	for addrs, want := range map[string][]Shadow{"192.0.2.10": onNode, "192.0.2.99": nil} {
		l, err := List(encodedTables{nft.IPv4: allLocal}, families, func() []netip.Addr { return []netip.Addr{netip.MustParseAddr(addrs)} })
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]Frontend{}
		for _, p := range l.Ports {
			for _, f := range p.Frontends {
				got[p.Service+" "+f.Type+" "+f.Address] = f
			}
		}
		if !slices.Equal(got[nodePort].Shadowed, want) || got[external].Shadowed != nil {
			t.Errorf("node ports on every local address, the node's %s: node port shadowed on %+v, external on %+v; want %+v",
				addrs, got[nodePort].Shadowed, got[external].Shadowed, want)
		}
	}
}
