package compile

import (
	"net/netip"
	"sort"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
	"github.com/nftproxy/nftproxy/nft/readback"
)

// TestKernelDifferential is the guarantee that what we write over netlink is what nft
// shows: each golden scenario is loaded from the renderer's text with "nft -f" in one
// namespace and applied through netlink in another, and "nft list ruleset" of both must
// be identical.
func TestKernelDifferential(t *testing.T) {
	names := make([]string, 0)
	for name := range scenarios() {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		for _, fam := range []nft.Family{nft.IPv4, nft.IPv6} {
			t.Run(name+"/"+fam.String(), func(t *testing.T) { differential(t, scenarios()[name], configFor(fam)) })
		}
	}
	// the --detect-local-mode goldens: source ranges and iifname matches
	for name, sc := range localModeScenarios() {
		for _, fam := range []nft.Family{nft.IPv4, nft.IPv6} {
			t.Run(name+"/"+fam.String(), func(t *testing.T) { differential(t, sc.snap, sc.config(fam)) })
		}
	}
}

func differential(t *testing.T, snap *model.Snapshot, cfg Config) {
	rs, _ := Compile(snap, cfg, NewSlots())
	text, viaNetlink := testnetns.New(t), testnetns.New(t)
	text.MustRun(t, nft.Render(rs), "nft", "-f", "-")
	if _, err := kernel.New(kernel.WithNetNS(viaNetlink.FD)).Apply(rs); err != nil {
		t.Fatalf("netlink apply: %v", err)
	}
	want := text.MustRun(t, "", "nft", "list", "ruleset")
	got := viaNetlink.MustRun(t, "", "nft", "list", "ruleset")
	if withoutSize(got) != withoutSize(want) { // the Applier sizes large sets, the text does not
		t.Errorf("nft list differs\n--- nft -f of rendered text:\n%s\n--- netlink:\n%s", want, got)
	}
}

// TestKernelSourceRangeChanges changes a Service's source ranges from one sync to the
// next (a range grows over its neighbour, ranges merge, split, move by one address and
// go) through the incremental compiler and the applier's deltas: after each the
// kernel's interval set is exactly the expected one.
func TestKernelSourceRangeChanges(t *testing.T) {
	ns := testnetns.New(t)
	a := kernel.New(kernel.WithNetNS(ns.FD))
	cc := NewCompiler(testConfig(), NewSlots())
	steps := [][]string{
		{"100.64.0.0/24", "100.64.2.0/24"},
		{"100.64.0.0/23", "100.64.2.0/24"},              // grows to touch the next: one range
		{"100.64.0.0/24", "100.64.2.0/24"},              // splits again
		{"100.64.1.0/24", "100.64.3.0/24"},              // starts where an end was
		{"100.64.1.0/24", "100.64.3.0/24", "0.0.0.0/8"}, // a range at the zero address
		{"255.255.255.0/24", "100.64.1.1/32"},           // one up to the last address
		{"100.64.1.0/24"},
	}
	for i, ranges := range steps {
		sps := rangesService(1, 0)
		for _, r := range ranges {
			sps[0].SourceRanges = append(sps[0].SourceRanges, netip.MustParsePrefix(r))
		}
		rs, _ := cc.Compile(snapshot(sps...))
		if _, err := a.Apply(rs); err != nil {
			t.Fatalf("step %d %v: %v", i, ranges, err)
		}
		d, err := readback.Reader{NetNS: ns.FD}.Verify(rs)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Empty() {
			t.Fatalf("step %d %v: kernel differs:\n%s", i, ranges, d)
		}
		list := ns.MustRun(t, "", "nft", "list", "set", "ip", TableName, ChainName("fw", sps[0].Name))
		t.Logf("step %d: %s", i, strings.Join(strings.Fields(list), " "))
	}
}
