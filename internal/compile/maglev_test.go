package compile

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/nft"
)

func maglevKeys(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("10.244.%d.%d:8080", i/250, 1+i%250)
	}
	return out
}

// TestMaglevTable: every entry filled, shares within the bound of the table size, the
// same table whatever the order of the endpoints, and removing one of ten endpoints
// moves at most 12 % of 10,000 hash inputs (a random choice would move about 90 %).
func TestMaglevTable(t *testing.T) {
	for _, n := range []int{1, 2, 3, 10, 41, 100, 200, 1000} {
		keys := maglevKeys(n)
		m := maglevSize(n)
		tab := maglevTable(keys, m)
		if len(tab) != m {
			t.Fatalf("n=%d: table of %d entries, want %d", n, len(tab), m)
		}
		count := make([]int, n)
		for _, e := range tab {
			if e < 0 || e >= n {
				t.Fatalf("n=%d: entry %d", n, e)
			}
			count[e]++
		}
		fair := float64(m) / float64(n)
		lo, hi := slices.Min(count), slices.Max(count)
		if n*100 <= MaglevMaxSize && (float64(hi) > fair*1.1+1 || float64(lo) < fair*0.9-1) {
			t.Errorf("n=%d m=%d: shares %d..%d, fair %.1f", n, m, lo, hi, fair)
		}
		shuffled := slices.Clone(keys)
		rand.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		tab2 := maglevTable(shuffled, m)
		for i := range tab {
			if keys[tab[i]] != shuffled[tab2[i]] {
				t.Fatalf("n=%d: entry %d differs with the endpoints in another order", n, i)
			}
		}
	}
	if maglevTable(nil, 61) != nil {
		t.Error("no endpoints: want no table")
	}

	keys := maglevKeys(10)
	m := maglevSize(10)
	before := maglevTable(keys, m)
	removed := 3
	rest := slices.Delete(slices.Clone(keys), removed, removed+1)
	after := maglevTable(rest, m)
	const inputs = 10000
	rng := rand.New(rand.NewPCG(1, 2))
	moved, onRemoved := 0, 0
	for range inputs {
		b := rng.IntN(m)
		if keys[before[b]] != rest[after[b]] {
			moved++
		}
		if before[b] == removed {
			onRemoved++
		}
	}
	frac := float64(moved) / inputs
	t.Logf("10 → 9 endpoints, table %d: %.1f %% of %d inputs moved (%.1f %% were on the removed endpoint)", m, 100*frac, inputs, 100*float64(onRemoved)/inputs)
	if frac > 0.12 {
		t.Errorf("%.1f %% of flows moved, want at most 12 %%", 100*frac)
	}
}

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
// port with the fixed seed into its own table of maglevSize slots filled as maglevTable
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
	if hash == nil || hash.Mod != 4093 || hash.Seed != MaglevSeed {
		t.Fatalf("DNAT rule %+v, want jhash mod 4093 seed %#x:\n%s", hash, MaglevSeed, nft.Render(rs))
	}
	slots := elements(t, rs, hash.Map)
	if len(slots) != 4093 {
		t.Fatalf("%d slots in %s, want 4093", len(slots), hash.Map)
	}
	keys := maglevKeys(0)
	for i := range 10 {
		keys = append(keys, fmt.Sprintf("10.244.1.%d:5060", i+1))
	}
	tab := maglevTable(keys, 4093)
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
	lim := NewCompiler(cfg, NewSlots()).cfg.Limits
	if got := lim.cost(maglevSnapshot(10, model.BalancingDefault).Services[0]); got != hashed {
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
