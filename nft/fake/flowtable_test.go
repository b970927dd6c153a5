package fake_test

import (
	"errors"
	"strings"
	"syscall"
	"testing"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/fake"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

// withFlowtable is base with a flowtable on devs and a forward chain adding
// established flows to it (none when devs is empty).
func withFlowtable(devs ...string) *nft.Ruleset {
	rs := clone(base())
	if len(devs) == 0 {
		return rs
	}
	rs.Flowtables = []*nft.Flowtable{{Name: "ft", Devices: devs}}
	rs.Chains = append(rs.Chains, &nft.Chain{Name: "fwd", Hook: &nft.Hook{Type: nft.TypeFilter, Hook: nft.Forward, Priority: 10},
		Rules: []nft.Rule{{Stmts: []nft.Stmt{nft.MatchCtStateEstablished{}, nft.MatchCtStatusDNAT{},
			nft.Lookup{Fields: []nft.Field{nft.FieldCtOrigDaddr}, Set: "s"}, nft.FlowOffload{Flowtable: "ft"}}}}})
	return rs
}

// TestFlowtableLifecycle: the Applier creates a flowtable with the rule that uses it,
// adds the devices a later ruleset names (in a delta and in a full rewrite), and
// deletes it with its rule; what it wrote reads back as the ruleset.
func TestFlowtableLifecycle(t *testing.T) {
	f := fake.New()
	step := func(what string, rs *nft.Ruleset, want ...string) {
		t.Helper()
		if _, err := f.Apply(rs); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		got := f.Ruleset(nft.IPv4, "t")
		var devs []string
		for _, ft := range got.Flowtables {
			devs = append(devs, ft.Name+":"+strings.Join(ft.Devices, ","))
		}
		if strings.Join(devs, " ") != strings.Join(want, " ") {
			t.Errorf("%s: flowtables %q, want %q", what, devs, want)
		}
	}
	step("created", withFlowtable("eth0", "veth1"), "ft:eth0,veth1")
	if r := f.Render(nft.IPv4, "t"); !strings.Contains(r, "ct state established ct status dnat ct original ip daddr @s flow add @ft") ||
		!strings.Contains(r, "devices = { eth0, veth1 }") {
		t.Errorf("rendered:\n%s", r)
	}
	step("a device appears", withFlowtable("eth0", "veth1", "veth2"), "ft:eth0,veth1,veth2")
	f.Resync()
	step("rewritten", withFlowtable("eth0", "veth1", "veth2", "veth3"), "ft:eth0,veth1,veth2,veth3")
	step("removed", withFlowtable())
	f.Resync()
	step("created by a full rewrite", withFlowtable("eth0"), "ft:eth0")
	f.Resync()
	step("removed by a full rewrite", withFlowtable())
}

// TestFlowtableInUse: a flowtable a rule still uses cannot be deleted.
func TestFlowtableInUse(t *testing.T) {
	f := fake.New()
	if _, err := f.Apply(withFlowtable("eth0")); err != nil {
		t.Fatal(err)
	}
	bad := withFlowtable("eth0")
	bad.Flowtables = nil
	_, err := f.Apply(bad)
	var rejected *kernel.RejectedError
	if !errors.As(err, &rejected) || !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("deleting a flowtable in use: %v, want EBUSY", err)
	}
}
