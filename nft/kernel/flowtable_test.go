package kernel_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
	"github.com/nftproxy/nftproxy/nft/readback"
	"github.com/nftproxy/nftproxy/nft/wire"
)

// flowtableRuleset is a table with a set, a flowtable on devs and the forward rule
// using it (neither without devs).
func flowtableRuleset(devs ...string) *nft.Ruleset {
	rs := &nft.Ruleset{Family: nft.IPv4, Table: "t", Sets: []*nft.Set{{Name: "s", Key: []nft.Datatype{nft.TypeIPv4Addr}}},
		Chains: []*nft.Chain{{Name: "in", Hook: &nft.Hook{Type: nft.TypeFilter, Hook: nft.Input}}}}
	if len(devs) > 0 {
		rs.Flowtables = []*nft.Flowtable{{Name: "ft", Devices: devs}}
		rs.Chains = append(rs.Chains, &nft.Chain{Name: "fwd", Hook: &nft.Hook{Type: nft.TypeFilter, Hook: nft.Forward, Priority: 10},
			Rules: []nft.Rule{{Stmts: []nft.Stmt{nft.MatchCtStateEstablished{}, nft.MatchCtStatusDNAT{},
				nft.Lookup{Fields: []nft.Field{nft.FieldCtOrigDaddr}, Set: "s"}, nft.FlowOffload{Flowtable: "ft"}}}}})
	}
	return rs
}

// TestKernelFlowtable: the Applier creates a flowtable with its rule, adds devices in a
// delta, carries on when the kernel dropped a deleted device, rewrites it in a full
// write, and deletes it with its rule; nft lists what was written and the table reads
// back with it. Skipped, naming the kernel, where the kernel has no flowtables.
func TestKernelFlowtable(t *testing.T) {
	ns := testnetns.New(t)
	for _, d := range []string{"d0", "d1", "d2"} {
		ns.MustRun(t, "", "ip", "link", "add", d, "type", "veth", "peer", "name", "p"+d)
	}
	a := kernel.New(kernel.WithNetNS(ns.FD))
	if err := a.ProbeFlowtables(nft.IPv4); err != nil {
		t.Skipf("the kernel has no nf_tables flowtables: %v", err)
	}
	if out, _ := ns.Run(t, "", "nft", "list", "tables"); strings.Contains(out, "probe") {
		t.Fatalf("the probe left a table: %s", out)
	}
	devices := regexp.MustCompile(`devices = \{ ([^}]*) \}`)
	step := func(what string, rs *nft.Ruleset, want string) {
		t.Helper()
		if _, err := a.Apply(rs); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		out := ns.MustRun(t, "", "nft", "list", "table", "ip", "t")
		got := ""
		if m := devices.FindStringSubmatch(out); m != nil {
			got = strings.TrimSpace(m[1])
		}
		if got != want || (want != "") != strings.Contains(out, "ct original ip daddr @s flow add @ft") {
			t.Fatalf("%s: devices %q, want %q:\n%s", what, got, want, out)
		}
	}
	step("created", flowtableRuleset("d0"), "d0")
	step("a device added", flowtableRuleset("d0", "d1"), "d0, d1")
	ns.MustRun(t, "", "ip", "link", "del", "d1")
	step("a device deleted from the machine", flowtableRuleset("d0"), "d0")
	a.Resync()
	step("full rewrite", flowtableRuleset("d0", "d2"), "d0, d2")
	st, err := wire.ReadTable(ns.FD, nft.IPv4, "t")
	if err != nil {
		t.Fatal(err)
	}
	rs, undecoded := wire.Decode(st)
	if len(undecoded) > 0 || len(rs.Flowtables) != 1 || strings.Join(rs.Flowtables[0].Devices, ",") != "d0,d2" {
		t.Errorf("read back: flowtables %+v, undecoded %v", rs.Flowtables, undecoded)
	}
	if r := nft.Render(rs); !strings.Contains(r, "flow add @ft") {
		t.Errorf("read back and rendered:\n%s", r)
	}
	if d, err := readback.Compare(st, flowtableRuleset("d0", "d2")); err != nil || !d.Empty() {
		t.Errorf("compared with what was written: %v %v", d, err)
	}
	if d, _ := readback.Compare(st, flowtableRuleset("d0")); d.String() != "ip t: flowtable ft: devices d0, d2, expected d0" {
		t.Errorf("compared with other devices: %q", d.String())
	}
	step("removed", flowtableRuleset(), "")
	step("created again", flowtableRuleset("d2"), "d2")
	a.Resync()
	step("removed by a full rewrite", flowtableRuleset(), "")
}
