package compile

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/maglev"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/nft"
)

// maglevSnapshot is one UDP ClusterIP port with n endpoints and the given balancing.
func maglevSnapshot(n int, bal model.Balancing) *model.Snapshot {
	var eps []model.Endpoint
	for i := range n {
		eps = append(eps, ep(fmt.Sprintf("10.244.1.%d", i+1), 5060))
	}
	return &model.Snapshot{Services: model.Ports([]model.ServicePort{{
		Name:       model.ServicePortName{Namespace: "default", Name: "sip", Port: "sip", Protocol: model.ProtoUDP},
		ClusterIPs: []netip.Addr{ip("10.96.0.60")}, Port: 5060, Balancing: bal, Endpoints: eps,
	}})}
}

// TestMaglevPort: a consistently hashed port is chained, hashes the client's address and
// port with the fixed seed into its own table of maglev.Size slots filled as maglev.Table
// says, costs that table in the budget (annotated or by default), and an endpoint
// change rewrites only slot elements (no rule, no chain): kernel cost flat.
func TestMaglevPort(t *testing.T) {
	rs, _ := Compile(maglevSnapshot(10, model.BalancingMaglev), testConfig(), NewSlots())
	ch := chainNamed(rs, "svc-default/sip/udp/sip")
	if ch == nil {
		t.Fatalf("no service chain for the Maglev port:\n%s", nft.Render(rs))
	}
	var hash *nft.DNATHashMap
	for _, r := range ch.Rules {
		for _, s := range r.Stmts {
			if h, ok := s.(nft.DNATHashMap); ok {
				hash = &h
			}
		}
	}
	if hash == nil || hash.Mod != 4093 || hash.Seed != maglev.Seed {
		t.Fatalf("DNAT rule %+v, want jhash mod 4093 seed %#x:\n%s", hash, maglev.Seed, nft.Render(rs))
	}
	slots := elements(t, rs, hash.Map)
	if len(slots) != 4093 {
		t.Fatalf("%d slots in %s, want 4093", len(slots), hash.Map)
	}
	var keys []string
	for i := range 10 {
		keys = append(keys, fmt.Sprintf("10.244.1.%d:5060", i+1))
	}
	tab := maglev.Table(keys, 4093)
	for i, k := range tab {
		key := fmt.Sprint(hash.Offset + uint32(i))
		if got, want := slots[key], strings.Replace(keys[k], ":", " . ", 1); got != want {
			t.Fatalf("slot %s: %q, want %q", key, got, want)
		}
	}

	// the same port without the annotation: random (numgen), unless the default is Maglev
	if rs, _ := Compile(maglevSnapshot(10, model.BalancingDefault), testConfig(), NewSlots()); strings.Contains(nft.Render(rs), "jhash") {
		t.Error("a port without the annotation is hashed under the random default")
	}
	cfg := testConfig()
	cfg.DefaultBalancing = model.BalancingMaglev
	if rs, _ := Compile(maglevSnapshot(10, model.BalancingDefault), cfg, NewSlots()); !strings.Contains(nft.Render(rs), "jhash") {
		t.Error("--load-balancing=maglev: a port without the annotation is not hashed")
	}
	if rs, _ := Compile(maglevSnapshot(10, model.BalancingRandom), cfg, NewSlots()); strings.Contains(nft.Render(rs), "jhash") {
		t.Error(`annotation "random" under the Maglev default: hashed`)
	}

	// cost: the table is counted, with the annotation or by default
	plain, hashed := ElementCost(maglevSnapshot(10, model.BalancingDefault).Services[0]), ElementCost(maglevSnapshot(10, model.BalancingMaglev).Services[0])
	if hashed-plain != 4093-10 {
		t.Errorf("ElementCost: %d with Maglev, %d without; want 4083 more", hashed, plain)
	}
	if got := cfg.cost(maglevSnapshot(10, model.BalancingDefault).Services[0]); got != hashed {
		t.Errorf("cost under the Maglev default: %d, want %d", got, hashed)
	}

	// one endpoint goes: the chains are unchanged, about a tenth of the slots change
	c := NewCompiler(testConfig(), NewSlots())
	before, _ := c.Compile(maglevSnapshot(10, model.BalancingMaglev))
	before = before.Flatten()
	after, _ := c.Compile(maglevSnapshot(9, model.BalancingMaglev))
	after = after.Flatten()
	chains := func(rs *nft.Ruleset) string {
		var b strings.Builder
		for _, ch := range rs.Chains {
			for _, r := range ch.Rules {
				b.WriteString(ch.Name + ": " + nft.RenderRule(rs.Family, r) + "\n")
			}
		}
		return b.String()
	}
	if chains(before) != chains(after) {
		t.Errorf("an endpoint change rewrote rules:\n%s", lineDiff(chains(before), chains(after)))
	}
	a, b := elements(t, before, hash.Map), elements(t, after, hash.Map)
	changed := 0
	for k, v := range a {
		if b[k] != v {
			changed++
		}
	}
	if len(b) != 4093 || changed > 4093*12/100 {
		t.Errorf("after removing one of 10 endpoints: %d slots, %d changed (want 4093, at most 12 %%)", len(b), changed)
	}
	t.Logf("one of 10 endpoints removed: %d of 4093 slots changed (%.1f %%)", changed, 100*float64(changed)/4093)
}
