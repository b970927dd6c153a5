package kernel_test

import (
	"errors"
	"fmt"
	"github.com/google/nftables"
	"net/netip"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/internal/testrules"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

func cfg() compile.Config { return testrules.Config() }

// svc returns a service port with n endpoints, numbered from first.
var svc = testrules.Service

// listTable returns "nft list table ip nftproxy" with its sets and chains sorted.
func listTable(t *testing.T, ns *testnetns.NS) string { return testrules.ListTable(t, ns) }

// TestIncrementalEqualsFresh applies a sequence of snapshots through one Applier (so all
// but the first are deltas) and checks after each step that the kernel holds exactly
// what a fresh, full apply of the same ruleset produces.
func TestIncrementalEqualsFresh(t *testing.T) {
	steps := []struct {
		name string
		svcs []model.ServicePort
	}{
		{"empty", nil},
		{"one service", []model.ServicePort{svc("a", "10.96.0.1", 0, 0, 2)}},
		{"scale up and add nodeport service", []model.ServicePort{svc("a", "10.96.0.1", 0, 0, 3), svc("b", "10.96.0.2", 30080, 10, 1)}},
		{"endpoints move", []model.ServicePort{svc("a", "10.96.0.1", 0, 5, 3), svc("b", "10.96.0.2", 30080, 10, 1)}},
		{"b loses endpoints", []model.ServicePort{svc("a", "10.96.0.1", 0, 5, 3), svc("b", "10.96.0.2", 30080, 10, 0)}},
		{"a grows past a slot block", []model.ServicePort{svc("a", "10.96.0.1", 0, 0, 40), svc("b", "10.96.0.2", 30080, 10, 0)}},
		{"a deleted, c added", []model.ServicePort{svc("b", "10.96.0.2", 30080, 10, 2), svc("c", "10.96.0.3", 0, 100, 1)}},
		{"all gone", nil},
	}
	inc := testnetns.New(t)
	applier := kernel.New(kernel.WithNetNS(inc.FD))
	slots := compile.NewSlots()
	for i, step := range steps {
		snap := &model.Snapshot{Services: model.Ports(step.svcs)}
		rs, _ := compile.Compile(snap, cfg(), slots)
		st, err := applier.Apply(rs)
		if err != nil {
			t.Fatalf("step %d (%s): %v", i, step.name, err)
		}
		if st.Full != (i == 0) {
			t.Errorf("step %d (%s): Full=%v", i, step.name, st.Full)
		}
		fresh := testnetns.New(t)
		if _, err := kernel.New(kernel.WithNetNS(fresh.FD)).Apply(rs); err != nil {
			t.Fatalf("step %d fresh apply: %v", i, err)
		}
		if got, want := listTable(t, inc), listTable(t, fresh); got != want {
			t.Fatalf("step %d (%s): incremental result differs from fresh apply\n--- fresh:\n%s\n--- incremental:\n%s", i, step.name, want, got)
		}
	}
}

// TestUnchangedSyncSendsOnlyTheTable checks that a sync without changes is a no-op
// transaction: nothing but the (idempotent) table message; and that one more endpoint
// is a small delta, for a service port on the flat path and for one with chains of its own.
func TestUnchangedSyncSendsOnlyTheTable(t *testing.T) {
	for _, tc := range []struct {
		name string
		sp   func(n int) model.ServicePort
		// what one more endpoint (3 -> 4) sends
		chains, elements int
		why              string
	}{
		// the cluster IP and the node port: one endpoint entry each and their count's
		// bits 3 -> 4 (bit0, bit1 deleted, bit2 added); one hairpin element
		{"flat", func(n int) model.ServicePort { return svc("a", "10.96.0.1", 30080, 0, n) }, 0, 9,
			"no chain, 2 endpoint entries, 6 count bits, 1 hairpin"},
		// an external Local policy with a node port keeps a chain and endpoint slots
		{"chained", func(n int) model.ServicePort {
			sp := svc("a", "10.96.0.1", 30080, 0, n)
			sp.ExternalPolicyLocal = true
			return sp
		}, 1, 2, "1 chain (new mod) and 2 elements (slot, hairpin)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := testnetns.New(t)
			applier := kernel.New(kernel.WithNetNS(ns.FD))
			snap := &model.Snapshot{Services: model.Ports([]model.ServicePort{tc.sp(3)})}
			slots := compile.NewSlots()
			rs, _ := compile.Compile(snap, cfg(), slots)
			if _, err := applier.Apply(rs); err != nil {
				t.Fatal(err)
			}
			rs2, _ := compile.Compile(snap, cfg(), slots)
			st, err := applier.Apply(rs2)
			if err != nil {
				t.Fatal(err)
			}
			if st.Messages != 1 || st.Elements != 0 || st.Chains != 0 {
				t.Fatalf("no-op sync sent %+v, want only the table message", st)
			}
			// One endpoint more: a few elements (and a chain when chained), not the whole table.
			sp := tc.sp(4)
			snap.Services[0] = &sp
			rs3, _ := compile.Compile(snap, cfg(), slots)
			st, err = applier.Apply(rs3)
			if err != nil {
				t.Fatal(err)
			}
			if st.Full || st.Chains != tc.chains || st.Elements != tc.elements {
				t.Fatalf("one added endpoint: %+v, want %s", st, tc.why)
			}
			fresh := testnetns.New(t)
			if _, err := kernel.New(kernel.WithNetNS(fresh.FD)).Apply(rs3); err != nil {
				t.Fatal(err)
			}
			if got, want := listTable(t, ns), listTable(t, fresh); got != want {
				t.Fatalf("delta differs from a fresh apply\n--- fresh:\n%s\n--- delta:\n%s", want, got)
			}
		})
	}
}

// TestRejectedTransactionKeepsOldRuleset makes the kernel refuse a transaction (a verdict
// map element pointing at a chain that does not exist) and checks that the previous
// ruleset is intact, and that the next good Apply converges.
func TestRejectedTransactionKeepsOldRuleset(t *testing.T) {
	ns := testnetns.New(t)
	applier := kernel.New(kernel.WithNetNS(ns.FD))
	slots := compile.NewSlots()
	good, _ := compile.Compile(&model.Snapshot{Services: model.Ports([]model.ServicePort{svc("a", "10.96.0.1", 0, 0, 2)})}, cfg(), slots)
	if _, err := applier.Apply(good); err != nil {
		t.Fatal(err)
	}
	before := listTable(t, ns)

	bad, _ := compile.Compile(&model.Snapshot{Services: model.Ports([]model.ServicePort{svc("a", "10.96.0.1", 0, 0, 2), svc("b", "10.96.0.2", 0, 5, 1)})}, cfg(), slots)
	for _, s := range bad.Sets {
		if s.Name == "service-ips" {
			s.Elements = append(s.Elements, nft.Element{
				Key:     []nft.Value{nft.Addr(netip.MustParseAddr("10.96.0.99")), nft.Num(6), nft.Num(80)},
				Verdict: &nft.Verdict{Kind: nft.Goto, Chain: "no-such-chain"},
			})
		}
	}
	_, badErr := applier.Apply(bad)
	if badErr == nil {
		t.Fatal("kernel accepted a goto to a missing chain")
	} else if !strings.Contains(badErr.Error(), "refused") {
		t.Errorf("error does not say the kernel refused: %v", badErr)
	}
	if after := listTable(t, ns); after != before {
		t.Fatalf("failed transaction changed the kernel\n--- before:\n%s\n--- after:\n%s", before, after)
	}
	fixed, _ := compile.Compile(&model.Snapshot{Services: model.Ports([]model.ServicePort{svc("a", "10.96.0.1", 0, 0, 2), svc("b", "10.96.0.2", 0, 5, 1)})}, cfg(), slots)
	st, err := applier.Apply(fixed)
	if err != nil {
		t.Fatalf("apply after failure: %v", err)
	}
	if st.Full {
		t.Errorf("apply after a refused transaction rewrote the whole table; the kernel kept the old one, so a delta suffices")
	}
	var rejected *kernel.RejectedError
	if !errors.As(badErr, &rejected) {
		t.Errorf("refusal is not a *kernel.RejectedError: %v", badErr)
	}
	fresh := testnetns.New(t)
	if _, err := kernel.New(kernel.WithNetNS(fresh.FD)).Apply(fixed); err != nil {
		t.Fatal(err)
	}
	if got, want := listTable(t, ns), listTable(t, fresh); got != want {
		t.Fatalf("delta after a refusal differs from a fresh apply\n--- fresh:\n%s\n--- after:\n%s", want, got)
	}
}

// TestResyncRepairsTampering deletes, changes and adds elements, flushes chains and adds
// a foreign rule and chain behind the applier's back, on the flat path and in a service
// port's own chains; a Resync'd Apply restores exactly the ruleset.
func TestResyncRepairsTampering(t *testing.T) {
	ns := testnetns.New(t)
	applier := kernel.New(kernel.WithNetNS(ns.FD))
	// a is on the flat path; b, with session affinity, has chains of its own
	b := svc("b", "10.96.0.2", 0, 10, 2)
	b.AffinityTimeout = 10800
	rs, _ := compile.Compile(&model.Snapshot{Services: model.Ports([]model.ServicePort{svc("a", "10.96.0.1", 30080, 0, 2), b})}, cfg(), compile.NewSlots())
	if _, err := applier.Apply(rs); err != nil {
		t.Fatal(err)
	}
	want := listTable(t, ns)
	ns.MustRun(t, "", "nft", "delete", "element", "ip", "nftproxy", "service-ips", "{ 10.96.0.2 . tcp . 80 }")
	ns.MustRun(t, "", "nft", "flush", "chain", "ip", "nftproxy", "svc-default/b/tcp/http")
	ns.MustRun(t, "", "nft", "delete", "element", "ip", "nftproxy", "cluster-frontends", "{ 10.96.0.1 . tcp . 80 }")
	ns.MustRun(t, "", "nft", "delete", "element", "ip", "nftproxy", "endpoints", "{ 10.96.0.1 . tcp . 80 . 0 }")
	ns.MustRun(t, "", "nft", "add", "element", "ip", "nftproxy", "endpoints", "{ 10.96.0.1 . tcp . 80 . 0 : 10.244.9.9 . 9999 }")
	ns.MustRun(t, "", "nft", "delete", "element", "ip", "nftproxy", "nodeport-endpoints", "{ tcp . 30080 . 1 }")
	ns.MustRun(t, "", "nft", "add", "element", "ip", "nftproxy", "endpoint-count-bit0", "{ 10.96.0.1 . tcp . 80 }")
	ns.MustRun(t, "", "nft", "flush", "chain", "ip", "nftproxy", "cluster-frontend")
	ns.MustRun(t, "", "nft", "add", "rule", "ip", "nftproxy", "services", "counter", "drop")
	ns.MustRun(t, "", "nft", "add", "chain", "ip", "nftproxy", "intruder")
	ns.MustRun(t, "", "nft", "add", "table", "ip", "other")
	ns.MustRun(t, "", "nft", "add", "chain", "ip", "other", "keep")
	if got := listTable(t, ns); got == want {
		t.Fatal("tampering left the table as it was")
	}
	applier.Resync()
	if _, err := applier.Apply(rs); err != nil {
		t.Fatal(err)
	}
	if got := listTable(t, ns); got != want {
		t.Fatalf("resync did not restore the table\n--- want:\n%s\n--- got:\n%s", want, got)
	}
	if out := ns.MustRun(t, "", "nft", "list", "table", "ip", "other"); !strings.Contains(out, "chain keep") {
		t.Fatalf("another table was touched:\n%s", out)
	}
}

// TestLargeTransaction applies 50,000 service ports × 10 endpoints (the large state of
// docs/reliability.md) in one transaction, as the proxy compiles them (one part per service port): on
// the flat path that is 800,000 elements, most of them endpoint entries of one map, in
// chunked element messages and sized socket buffers, no ENOBUFS, no EMSGSIZE. It counts
// what the kernel holds over netlink, then checks that one more endpoint is a small delta.
func TestLargeTransaction(t *testing.T) {
	const n, eps = 50000, 10
	ns := testnetns.New(t)
	svcs := make([]model.ServicePort, 0, n)
	for i := 0; i < n; i++ {
		s := svc(fmt.Sprintf("s%05d", i), fmt.Sprintf("10.%d.%d.%d", 96+i/65536, (i/256)%256, i%256), 0, 0, 0)
		for j := 0; j < eps; j++ {
			s.Endpoints = append(s.Endpoints, model.Endpoint{Addr: netip.AddrFrom4([4]byte{10, byte(128 + i/65536), byte(i / 256), byte(i)}), Port: uint16(8000 + j), Ready: true, Serving: true})
		}
		svcs = append(svcs, s)
	}
	cc := compile.NewCompiler(cfg(), compile.NewSlots())
	snap := &model.Snapshot{Services: model.Ports(svcs)}
	rs, _ := cc.Compile(snap)
	a := kernel.New(kernel.WithNetNS(ns.FD))
	st, err := a.Apply(rs)
	if err != nil {
		t.Fatalf("large apply (%d messages, %d bytes): %v", st.Messages, st.Bytes, err)
	}
	t.Logf("applied %d messages, %d bytes, %d elements; kernel %v", st.Messages, st.Bytes, st.Elements, st.Kernel)
	if !st.Full || st.Elements < n*(eps+1) {
		t.Fatalf("large apply: %+v, want a full transaction of at least %d elements", st, n*(eps+1))
	}
	conn, err := nftables.New(nftables.WithNetNSFd(ns.FD))
	if err != nil {
		t.Fatal(err)
	}
	table := &nftables.Table{Name: compile.TableName, Family: nftables.TableFamilyIPv4}
	sets, err := conn.GetSets(table)
	if err != nil {
		t.Fatal(err)
	}
	count := func(name string) int {
		for _, s := range sets {
			if s.Name == name {
				es, err := conn.GetSetElements(s)
				if err != nil {
					t.Fatalf("reading %s: %v", s.Name, err)
				}
				return len(es)
			}
		}
		t.Fatalf("no set %s", name)
		return 0
	}
	// The endpoints map is not read back: the kernel resumes a dump of a hash set by
	// walking it from the start, so listing 500,000 entries takes a minute or more
	// (quadratic; nft get element lists the set too). The transaction sent every one of
	// them (Stats), and the kernel committed it; the other sets, which were sent the same
	// way, are counted in full.
	byName := map[string]*nft.Set{}
	distinct := map[string]bool{} // parts share elements (hairpin): the kernel holds one
	for _, s := range rs.Sets {
		byName[s.Name] = s
		for _, e := range s.Elements {
			distinct[s.Name+" "+nft.RenderElementKey(s, e)] = true
		}
	}
	for _, p := range rs.Parts {
		for _, se := range p.Elements {
			for _, e := range se.All() {
				distinct[se.Set+" "+nft.RenderElementKey(byName[se.Set], e)] = true
			}
		}
	}
	if st.Elements != len(distinct) || len(distinct) < n*(eps+1) {
		t.Fatalf("large apply sent %d elements, the ruleset has %d", st.Elements, len(distinct))
	}
	if got := count("cluster-frontends"); got != n {
		t.Fatalf("cluster-frontends has %d elements, want %d", got, n)
	}
	for b := 0; eps>>b > 0; b++ { // the count's bits: 10 = 0b1010
		if got, want := count(fmt.Sprintf("endpoint-count-bit%d", b)), n*(eps>>b&1); got != want {
			t.Fatalf("endpoint-count-bit%d has %d elements, want %d", b, got, want)
		}
	}
	if got := count("service-ips"); got != 0 {
		t.Fatalf("service-ips has %d elements, want none: every service port is flat", got)
	}
	chains, err := conn.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	if err != nil {
		t.Fatal(err)
	}
	want := len(rs.Chains)
	for _, p := range rs.Parts {
		want += len(p.Chains)
	}
	if len(chains) != want || want > 1000 {
		t.Fatalf("%d chains, want the ruleset's %d shared chains and none per service port", len(chains), want)
	}
	snap.Services[n/2].Endpoints = append(snap.Services[n/2].Endpoints[:eps:eps], model.Endpoint{Addr: netip.MustParseAddr("10.250.0.1"), Port: 8080, Ready: true, Serving: true})
	rs, _ = cc.Compile(snap)
	if st, err = a.Apply(rs); err != nil || st.Full || st.Messages > 8 || st.Chains != 0 {
		t.Fatalf("one endpoint more at %d service ports: %+v, %v; want a delta of a few messages", n, st, err)
	}
}

// TestCounters sends UDP datagrams from a process in a throwaway namespace to two
// service addresses and reads the per-element counters back.
func TestCounters(t *testing.T) {
	ns := testnetns.New(t)
	ns.MustRun(t, "", "sh", "-c", "ip link add d0 type veth peer name d1 && ip addr add 192.0.2.1/24 dev d0 && ip link set d0 up && ip link set d1 up && ip route add default dev d0")
	applier := kernel.New(kernel.WithNetNS(ns.FD))
	a, b := svc("a", "10.96.0.1", 0, 0, 1), svc("b", "10.96.0.2", 0, 5, 0)
	a.Name.Protocol, b.Name.Protocol = model.ProtoUDP, model.ProtoUDP
	rs, _ := compile.Compile(&model.Snapshot{Services: model.Ports([]model.ServicePort{a, b})}, cfg(), compile.NewSlots())
	if _, err := applier.Apply(rs); err != nil {
		t.Fatal(err)
	}
	// 3 datagrams to a (DNATed), 2 to b (no endpoints: rejected), from the node itself.
	ns.MustRun(t, "", "bash", "-c", "for i in 1 2 3; do echo x > /dev/udp/10.96.0.1/80; done; for i in 1 2; do echo y > /dev/udp/10.96.0.2/80; done; true")
	counts, err := applier.SetCounts(nft.IPv4, "nftproxy", "service-counters")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for _, c := range counts {
		got[c.Comment] = c.Packets
	}
	if got["default/a:http"] != 3 || got["default/b:http"] != 2 {
		t.Fatalf("packets per service = %v, want a:3 b:2", got)
	}
	rejects, err := applier.RuleCounts(nft.IPv4, "nftproxy", "reject-chain")
	if err != nil {
		t.Fatal(err)
	}
	if len(rejects) != 1 || rejects[0].Packets != 2 {
		t.Fatalf("reject counter = %+v, want 2 packets", rejects)
	}
}
