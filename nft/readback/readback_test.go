package readback_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/readback"
	"github.com/nftproxy/nftproxy/nft/wire"
)

// verifySnapshot has every kind of object the compiler makes: node ports, external and
// load-balancer IPs with source ranges, a Local traffic policy, ClientIP affinity
// (dynamic sets), a service without endpoints, and a hairpin set.
func verifySnapshot() *model.Snapshot {
	a := svc("a", "10.96.0.1", 30080, 0, 2)
	sticky := svc("sticky", "10.96.0.2", 0, 10, 2)
	sticky.AffinityTimeout = 10800
	lb := svc("lb", "10.96.0.3", 30443, 20, 3)
	lb.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.51.100.1")}
	lb.ExternalIPs = []netip.Addr{netip.MustParseAddr("203.0.113.7")}
	lb.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
	lb.ExternalPolicyLocal = true
	lb.Endpoints[0].NodeName = "node-1"
	empty := svc("empty", "10.96.0.4", 30081, 0, 0)
	return &model.Snapshot{
		Node:     model.Node{Name: "node-1", IPs: []netip.Addr{netip.MustParseAddr("192.0.2.10")}},
		Services: model.Ports([]model.ServicePort{a, sticky, lb, empty}),
	}
}

func cfg6() compile.Config {
	return compile.Config{
		Family:        nft.IPv6,
		DetectLocal:   compile.DetectLocal{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("fd00:244::/56")}},
		MasqueradeBit: 14,
		NodePortAddrs: []netip.Addr{netip.MustParseAddr("2001:db8::10")},
	}
}

// verifySnapshot6 is verifySnapshot with IPv6 addresses.
func verifySnapshot6() *model.Snapshot {
	snap := verifySnapshot()
	six := func(a netip.Addr) netip.Addr {
		b := a.As4()
		return netip.AddrFrom16([16]byte{0xfd, 0, 2, 0x44, 12: b[0], 13: b[1], 14: b[2], 15: b[3]})
	}
	snap.Node.IPs = []netip.Addr{netip.MustParseAddr("2001:db8::10")}
	for _, sp := range snap.Services {
		sp.ClusterIPs = []netip.Addr{six(sp.ClusterIPs[0])}
		for j := range sp.Endpoints {
			sp.Endpoints[j].Addr = six(sp.Endpoints[j].Addr)
		}
		for j := range sp.LoadBalancerIPs {
			sp.LoadBalancerIPs[j] = six(sp.LoadBalancerIPs[j])
		}
		for j := range sp.ExternalIPs {
			sp.ExternalIPs[j] = six(sp.ExternalIPs[j])
		}
		for j := range sp.SourceRanges {
			sp.SourceRanges[j] = netip.PrefixFrom(six(sp.SourceRanges[j].Addr()), 120)
		}
	}
	return snap
}

func mustVerify(t *testing.T, a applierReader, rs *nft.Ruleset, opts ...readback.Option) readback.Diff {
	t.Helper()
	d, err := a.Verify(rs, opts...)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	return d
}

// TestVerifyEqualAfterApply applies a ruleset and reads it back: no difference. The same
// ruleset loaded by nft from its rendered text reads back equal too, so what Verify
// compares is what nft itself encodes.
func TestVerifyEqualAfterApply(t *testing.T) {
	ns := testnetns.New(t)
	a := newApplier(ns)
	rs, _ := compile.Compile(verifySnapshot(), cfg(), compile.NewSlots())
	if _, err := a.Apply(rs); err != nil {
		t.Fatal(err)
	}
	if d := mustVerify(t, a, rs); !d.Empty() {
		t.Fatalf("freshly applied ruleset differs from the kernel:\n%s", d)
	}
	got, err := a.ReadBack(rs.Family, rs.Table)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Chains) != len(rs.Chains) || len(got.Sets) != len(rs.Sets) {
		t.Fatalf("read back %d chains and %d sets, want %d and %d", len(got.Chains), len(got.Sets), len(rs.Chains), len(rs.Sets))
	}
	if h := got.Chains["nat-prerouting"].Hook; h == nil || h.Type != "nat" || h.Hooknum != uint32(nft.Prerouting) || h.Priority != -100 {
		t.Errorf("nat-prerouting hook read back as %+v", h)
	}
	for _, s := range rs.Sets {
		if s.Interval { // two kernel elements a range (its start, the address after it)
			if n := len(got.Sets[s.Name].Elements); n != 2*len(s.Elements) {
				t.Errorf("set %s: read back %d elements, want %d for %d ranges", s.Name, n, 2*len(s.Elements), len(s.Elements))
			}
			continue
		}
		if !s.Dynamic && len(got.Sets[s.Name].Elements) != len(s.Elements) {
			t.Errorf("set %s: read back %d elements, want %d", s.Name, len(got.Sets[s.Name].Elements), len(s.Elements))
		}
	}

	// IPv6: concatenations put fields in registers the kernel names differently in dumps.
	rs6, _ := compile.Compile(verifySnapshot6(), cfg6(), compile.NewSlots())
	if _, err := a.Apply(rs6); err != nil {
		t.Fatal(err)
	}
	if d := mustVerify(t, a, rs6); !d.Empty() {
		t.Fatalf("freshly applied IPv6 ruleset differs from the kernel:\n%s", d)
	}

	byNft := testnetns.New(t)
	byNft.MustRun(t, nft.Render(rs), "nft", "-f", "-")
	if d := mustVerify(t, newApplier(byNft), rs); !d.Empty() {
		t.Fatalf("the ruleset as nft loads it differs from our encoding:\n%s", d)
	}

	// A table that is not there.
	if d := mustVerify(t, newApplier(testnetns.New(t)), rs); !slices.Equal(d, readback.Diff{"ip nftproxy: table missing"}) {
		t.Fatalf("empty namespace: %q", d)
	}
}

// TestVerifyReportsTampering changes the table behind the applier's back in several ways;
// Verify reports exactly that change, and after a repairing Apply nothing.
func TestVerifyReportsTampering(t *testing.T) {
	ns := testnetns.New(t)
	a := newApplier(ns)
	rs, _ := compile.Compile(verifySnapshot(), cfg(), compile.NewSlots())
	if _, err := a.Apply(rs); err != nil {
		t.Fatal(err)
	}
	// a has no chain of its own (the flat path: frontends and endpoints are elements);
	// lb has one (an external Local policy), with endpoint slots
	svcLB := "svc-default/lb/tcp/http"
	var dnatLB, clusterFront string
	nServices := 0
	for _, c := range rs.Chains {
		switch c.Name {
		case svcLB:
			dnatLB = nft.RenderRule(rs.Family, c.Rules[1])
		case "services":
			nServices = len(c.Rules)
		case "cluster-frontend":
			clusterFront = nft.RenderRule(rs.Family, c.Rules[1]) // goto the lb tree's root
		}
	}
	if dnatLB == "" || nServices == 0 || !strings.HasPrefix(clusterFront, "goto lb-") {
		t.Fatalf("ruleset lacks chain %s, services or cluster-frontend (%q)", svcLB, clusterFront)
	}
	extra := fmt.Sprintf("extra rule %d", nServices)
	cases := []struct {
		name   string
		tamper [][]string
		opts   []readback.Option
		want   []string
	}{
		{"delete element", [][]string{{"nft", "delete", "element", "ip", "nftproxy", "service-ips", "{ 10.96.0.3 . tcp . 80 }"}}, nil,
			[]string{`ip nftproxy: set service-ips: missing element 10.96.0.3 . tcp . 80 : goto ` + svcLB + ` comment "default/lb:http"`}},
		{"delete frontend", [][]string{{"nft", "delete", "element", "ip", "nftproxy", "cluster-frontends", "{ 10.96.0.1 . tcp . 80 }"}}, nil,
			[]string{`ip nftproxy: set cluster-frontends: missing element 10.96.0.1 . tcp . 80 comment "default/a:http"`}},
		{"delete endpoint entry", [][]string{{"nft", "delete", "element", "ip", "nftproxy", "nodeport-endpoints", "{ tcp . 30080 . 1 }"}}, nil,
			[]string{`ip nftproxy: set nodeport-endpoints: missing element tcp . 30080 . 1 : 10.244.0.2 . 8080`}},
		{"add element", [][]string{{"nft", "add", "element", "ip", "nftproxy", "hairpin", "{ 10.244.9.9 . 10.244.9.9 }"}}, nil,
			[]string{`ip nftproxy: set hairpin: extra element 10.244.9.9 . 10.244.9.9`}},
		{"add endpoint count bit", [][]string{{"nft", "add", "element", "ip", "nftproxy", "endpoint-count-bit0", "{ 10.96.0.1 . tcp . 80 }"}}, nil,
			[]string{`ip nftproxy: set endpoint-count-bit0: extra element 10.96.0.1 . tcp . 80`}},
		{"change element", [][]string{
			{"nft", "delete", "element", "ip", "nftproxy", "service-nodeports", "{ tcp . 30443 }"},
			{"nft", "add", "element", "ip", "nftproxy", "service-nodeports", "{ tcp . 30443 : drop }"},
		}, nil,
			[]string{`ip nftproxy: set service-nodeports: element differs: kernel tcp . 30443 : drop, expected tcp . 30443 : goto ext-default/lb/tcp/http comment "default/lb:http"`}},
		{"change endpoint entry", [][]string{
			{"nft", "delete", "element", "ip", "nftproxy", "endpoints", "{ 10.96.0.1 . tcp . 80 . 0 }"},
			{"nft", "add", "element", "ip", "nftproxy", "endpoints", "{ 10.96.0.1 . tcp . 80 . 0 : 10.244.9.9 . 9999 }"},
		}, nil,
			[]string{`ip nftproxy: set endpoints: element differs: kernel 10.96.0.1 . tcp . 80 . 0 : 10.244.9.9 . 9999, expected 10.96.0.1 . tcp . 80 . 0 : 10.244.0.1 . 8080`}},
		{"add rule", [][]string{{"nft", "add", "rule", "ip", "nftproxy", "services", "counter", "drop"}}, nil,
			[]string{"ip nftproxy: chain services: " + extra + ": `counter packets 0 bytes 0 drop`"}},
		{"insert rule", [][]string{{"nft", "insert", "rule", "ip", "nftproxy", "mark-for-masquerade", "ip", "saddr", "10.1.2.3", "accept"}}, nil,
			[]string{"ip nftproxy: chain mark-for-masquerade: extra rule 0: `ip saddr 10.1.2.3 accept`"}},
		{"flush chain", [][]string{{"nft", "flush", "chain", "ip", "nftproxy", svcLB}}, nil,
			[]string{
				"ip nftproxy: chain " + svcLB + ": missing rule 0: `ip daddr 10.96.0.3 ip saddr != 10.244.0.0/16 jump mark-for-masquerade`",
				"ip nftproxy: chain " + svcLB + ": missing rule 1: `" + dnatLB + "`",
			}},
		{"flush shared chain", [][]string{{"nft", "flush", "chain", "ip", "nftproxy", "cluster-frontend"}}, nil,
			[]string{
				"ip nftproxy: chain cluster-frontend: missing rule 0: `ip saddr != 10.244.0.0/16 jump mark-for-masquerade`",
				"ip nftproxy: chain cluster-frontend: missing rule 1: `" + clusterFront + "`",
			}},
		{"add chain", [][]string{{"nft", "add", "chain", "ip", "nftproxy", "intruder"}}, nil,
			[]string{"ip nftproxy: chain intruder extra (0 rules)"}},
		{"add chain with a rule", [][]string{
			{"nft", "add", "chain", "ip", "nftproxy", "intruder"},
			{"nft", "add", "rule", "ip", "nftproxy", "intruder", "ip", "daddr", "10.0.0.0/8", "drop"},
		}, nil,
			[]string{"ip nftproxy: chain intruder extra (1 rules)", "ip nftproxy: chain intruder: extra rule 0: `ip daddr 10.0.0.0/8 drop`"}},
		{"a rule nftproxy never writes is shown by its expressions", [][]string{{"nft", "add", "rule", "ip", "nftproxy", "services", "tcp", "dport", "22", "accept"}}, nil,
			[]string{"ip nftproxy: chain services: " + extra + ": [meta key 16, cmp == 06, payload transport+2/2, cmp == 0016, immediate accept]"}},
		{"learned affinity entries are not a difference", [][]string{
			{"nft", "add", "element", "ip", "nftproxy", "affinity-default/sticky/tcp/http/0", "{ 10.244.7.7 }"},
		}, nil, nil},
		{"delete endpoint slot", [][]string{{"nft", "delete", "element", "ip", "nftproxy", "endpoints-0", "{ 0 }"}}, nil,
			[]string{`ip nftproxy: set endpoints-0: missing element 0 : 10.244.0.21 . 8080`}},
		{"delete endpoint slot, slots by content", [][]string{{"nft", "delete", "element", "ip", "nftproxy", "endpoints-0", "{ 0 }"}},
			[]readback.Option{slotsByContent},
			[]string{"ip nftproxy: chain " + svcLB + ": rule 1 differs: kernel `" + dnatLB + "` selecting {10.244.0.22 . 8080, 10.244.0.23 . 8080, missing}, expected `" + dnatLB + "`"}},
		// the flat path's endpoints map is keyed by frontend and index, not by a slot:
		// compared exactly even by content
		{"change endpoint entry, slots by content", [][]string{
			{"nft", "delete", "element", "ip", "nftproxy", "endpoints", "{ 10.96.0.1 . tcp . 80 . 1 }"},
			{"nft", "add", "element", "ip", "nftproxy", "endpoints", "{ 10.96.0.1 . tcp . 80 . 1 : 10.244.0.1 . 8080 }"},
		}, []readback.Option{slotsByContent},
			[]string{`ip nftproxy: set endpoints: element differs: kernel 10.96.0.1 . tcp . 80 . 1 : 10.244.0.1 . 8080, expected 10.96.0.1 . tcp . 80 . 1 : 10.244.0.2 . 8080`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, cmd := range tc.tamper {
				ns.MustRun(t, "", cmd...)
			}
			if d := mustVerify(t, a, rs, tc.opts...); !slices.Equal(d, readback.Diff(tc.want)) {
				t.Errorf("Verify after %s:\n%s\nwant:\n%s", tc.name, d, strings.Join(tc.want, "\n"))
			}
			a.Resync()
			if _, err := a.Apply(rs); err != nil {
				t.Fatal(err)
			}
			if d := mustVerify(t, a, rs); !d.Empty() {
				t.Fatalf("after repair:\n%s", d)
			}
		})
	}
}

// TestVerifySlotsByContent programs endpoint slots with one allocation history and
// verifies against a fresh compile, whose slots differ: exact comparison sees the
// different slot numbers, comparison by content sees none.
func TestVerifySlotsByContent(t *testing.T) {
	ns := testnetns.New(t)
	a := newApplier(ns)
	snap := verifySnapshot()
	history := compile.NewSlots()
	// "first" has a chain of its own and endpoint slots (an external Local policy with a
	// node port), like lb; flat service ports have no slots
	first := svc("first", "10.96.0.9", 30090, 100, 40)
	first.ExternalPolicyLocal = true
	bigger := &model.Snapshot{Node: snap.Node, Services: append([]*model.ServicePort{&first}, snap.Services...)}
	compile.Compile(bigger, cfg(), history) // "first" takes slots 0-47; the others follow
	programmed, _ := compile.Compile(snap, cfg(), history)
	if _, err := a.Apply(programmed); err != nil {
		t.Fatal(err)
	}
	fresh, _ := compile.Compile(snap, cfg(), compile.NewSlots())
	if d := mustVerify(t, a, fresh); d.Empty() {
		t.Fatal("exact comparison found no difference between two slot layouts")
	}
	if d := mustVerify(t, a, fresh, slotsByContent); !d.Empty() {
		t.Fatalf("comparison by content:\n%s", d)
	}
	// A slot element no rule selects is a difference even by content.
	ns.MustRun(t, "", "nft", "add", "element", "ip", "nftproxy", "endpoints-0", "{ 250 : 10.244.5.5 . 80 }")
	want := readback.Diff{"ip nftproxy: set endpoints-0: element 250 : 10.244.5.5 . 80 is selected by no rule"}
	if d := mustVerify(t, a, fresh, slotsByContent); !slices.Equal(d, want) {
		t.Fatalf("stray slot element:\n%s\nwant:\n%s", d, want)
	}
	// The flat path's endpoint entries are keyed by frontend and index, the same
	// whatever the history: an extra one is a difference by content too.
	ns.MustRun(t, "", "nft", "add", "element", "ip", "nftproxy", "endpoints", "{ 10.96.0.1 . tcp . 80 . 2 : 10.244.5.5 . 80 }")
	want = append(readback.Diff{"ip nftproxy: set endpoints: extra element 10.96.0.1 . tcp . 80 . 2 : 10.244.5.5 . 80"}, want...)
	if d := mustVerify(t, a, fresh, slotsByContent); !slices.Equal(d, want) {
		t.Fatalf("stray endpoint entry:\n%s\nwant:\n%s", d, want)
	}
}

// TestCompareEncoded compares two encoded rulesets without a kernel: the differences of
// elements, rules and set definitions, formatted.
func TestCompareEncoded(t *testing.T) {
	slots := compile.NewSlots()
	old, _ := compile.Compile(verifySnapshot(), cfg(), slots)
	snap := verifySnapshot()
	snap.Services[0].ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.11")} // flat
	snap.Services[2].ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.13")} // chained
	snap.Services = snap.Services[:3]                                             // "empty" is gone
	snap.Services[1].AffinityTimeout = 60
	cur, _ := compile.Compile(snap, cfg(), slots)
	got, err := wire.EncodeState(old)
	if err != nil {
		t.Fatal(err)
	}
	d, err := readback.Compare(got, cur)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`ip nftproxy: set cluster-ips: missing element 10.96.0.11`,
		`ip nftproxy: set cluster-ips: extra element 10.96.0.1`,
		`ip nftproxy: set cluster-ips: missing element 10.96.0.13`,
		`ip nftproxy: set cluster-ips: extra element 10.96.0.3`,
		// a flat service port's frontend and endpoint entries
		`ip nftproxy: set cluster-frontends: missing element 10.96.0.11 . tcp . 80 comment "default/a:http"`,
		`ip nftproxy: set cluster-frontends: extra element 10.96.0.1 . tcp . 80 comment "default/a:http"`,
		`ip nftproxy: set endpoints: missing element 10.96.0.11 . tcp . 80 . 1 : 10.244.0.2 . 8080`,
		`ip nftproxy: set endpoints: extra element 10.96.0.1 . tcp . 80 . 1 : 10.244.0.2 . 8080`,
		`ip nftproxy: set endpoint-count-bit1: missing element 10.96.0.11 . tcp . 80`,
		`ip nftproxy: set endpoint-count-bit1: extra element 10.96.0.1 . tcp . 80`,
		// a chained one's element in service-ips
		`ip nftproxy: set service-ips: missing element 10.96.0.13 . tcp . 80 : goto svc-default/lb/tcp/http comment "default/lb:http"`,
		`ip nftproxy: set service-ips: extra element 10.96.0.3 . tcp . 80 : goto svc-default/lb/tcp/http comment "default/lb:http"`,
	}
	for _, w := range want {
		if !slices.Contains(d, w) {
			t.Errorf("missing line %q in\n%s", w, d)
		}
	}
	for _, l := range d {
		if !strings.HasPrefix(l, "ip nftproxy: ") {
			t.Errorf("line without table prefix: %q", l)
		}
	}
	if !strings.Contains(d.String(), "chain svc-default/lb/tcp/http: rule 0 differs: kernel `ip daddr 10.96.0.3 ip saddr != 10.244.0.0/16 jump mark-for-masquerade`, expected `ip daddr 10.96.0.13 ") {
		t.Errorf("changed rule not reported with its index and text:\n%s", d)
	}
	if !strings.Contains(d.String(), "set affinity-default/sticky/tcp/http/0: kernel definition `set affinity-default/sticky/tcp/http/0 { type ipv4_addr; flags dynamic,timeout; timeout 10800s; comment") ||
		!strings.Contains(d.String(), "expected `set affinity-default/sticky/tcp/http/0 { type ipv4_addr; flags dynamic,timeout; timeout 60s;") {
		t.Errorf("changed set definition not shown in nft syntax:\n%s", d)
	}
	if !strings.Contains(d.String(), `no-endpoint-services: extra element 10.96.0.4 . tcp . 80`) {
		t.Errorf("gone no-endpoint element not reported:\n%s", d)
	}
	if d, _ := readback.Compare(got, old); !d.Empty() {
		t.Errorf("a ruleset differs from itself:\n%s", d)
	}
}

// keyMaps is a table load-balancing through maps keyed by the packet's key and an index
// ("dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 2 map @endpoints").
func keyMaps() *nft.Ruleset {
	a := func(s string) nft.Value { return nft.Addr(netip.MustParseAddr(s)) }
	return &nft.Ruleset{Family: nft.IPv4, Table: "nftproxy", Sets: []*nft.Set{
		{Name: "endpoints", Key: []nft.Datatype{nft.TypeIPv4Addr, nft.TypeInetProto, nft.TypeInetService, nft.TypeNumgen},
			Data: []nft.Datatype{nft.TypeIPv4Addr, nft.TypeInetService}, Elements: []nft.Element{
				{Key: []nft.Value{a("10.96.0.10"), nft.Num(6), nft.Num(80), nft.Num(0)}, Data: []nft.Value{a("10.244.1.5"), nft.Num(8080)}},
				{Key: []nft.Value{a("10.96.0.10"), nft.Num(6), nft.Num(80), nft.Num(1)}, Data: []nft.Value{a("10.244.2.6"), nft.Num(8080)}},
			}},
		{Name: "nodeport-endpoints", Key: []nft.Datatype{nft.TypeInetProto, nft.TypeInetService, nft.TypeNumgen},
			Data: []nft.Datatype{nft.TypeIPv4Addr, nft.TypeInetService}, Elements: []nft.Element{
				{Key: []nft.Value{nft.Num(17), nft.Num(30053), nft.Num(0)}, Data: []nft.Value{a("10.244.1.5"), nft.Num(53)}},
			}},
	}, Chains: []*nft.Chain{{Name: "services", Rules: []nft.Rule{
		{Stmts: []nft.Stmt{nft.DNATKeyMap{Fields: []nft.Field{nft.FieldDaddr, nft.FieldL4Proto, nft.FieldTHDport}, Mod: 2, Map: "endpoints"}}},
		{Stmts: []nft.Stmt{nft.DNATKeyMap{Fields: []nft.Field{nft.FieldL4Proto, nft.FieldTHDport}, Mod: 1, Map: "nodeport-endpoints"}}},
	}}}}
}

// TestCompareKeyMaps: differences in the key maps and the rules reading them are
// described in nft syntax: elements with their index, rules as rendered, definitions as
// typeof.
func TestCompareKeyMaps(t *testing.T) {
	got, err := wire.EncodeState(keyMaps())
	if err != nil {
		t.Fatal(err)
	}
	if d, err := readback.Compare(got, keyMaps()); err != nil || !d.Empty() {
		t.Fatalf("a ruleset differs from itself: %v\n%s", err, d)
	}
	want := keyMaps()
	want.Sets[0].Elements[1].Data[0] = nft.Addr(netip.MustParseAddr("10.244.3.7"))
	want.Sets[1].Elements[0].Key[2] = nft.Num(1)
	want.Chains[0].Rules[0].Stmts[0] = nft.DNATKeyMap{Fields: []nft.Field{nft.FieldDaddr, nft.FieldL4Proto, nft.FieldTHDport}, Mod: 3, Map: "endpoints"}
	d, err := readback.Compare(got, want)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{
		"ip nftproxy: set endpoints: element differs: kernel 10.96.0.10 . tcp . 80 . 1 : 10.244.2.6 . 8080, expected 10.96.0.10 . tcp . 80 . 1 : 10.244.3.7 . 8080",
		"ip nftproxy: set nodeport-endpoints: missing element udp . 30053 . 1 : 10.244.1.5 . 53",
		"ip nftproxy: set nodeport-endpoints: extra element udp . 30053 . 0 : 10.244.1.5 . 53",
		"ip nftproxy: chain services: rule 0 differs: kernel `dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 2 map @endpoints`, expected `dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 3 map @endpoints`",
	} {
		if !slices.Contains(d, w) {
			t.Errorf("missing line %q in\n%s", w, d)
		}
	}
	if len(d) != 4 {
		t.Errorf("%d differences, want 4:\n%s", len(d), d)
	}
	if h := wire.SetHeader(nft.IPv4, got.Sets["nodeport-endpoints"]); h != "map nodeport-endpoints { typeof meta l4proto . th dport . numgen random mod 256 : ip daddr . th dport }" {
		t.Errorf("set header %q", h)
	}
}
