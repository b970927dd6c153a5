package compile

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"sort"
	"testing"

	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/nft"
)

// TestCompilerChangeSet walks random snapshots through one Compiler and checks that each
// ruleset's change set (nft.PartChanges) names exactly the parts that are not the
// previous ruleset's: added and recompiled owners with their new part, removed owners
// with nil, nothing else; and that it is derived from the previous ruleset only. After a
// node change (every part compiled anew) there is no change set.
func TestCompilerChangeSet(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	all := pool()
	node := model.Node{Name: "node-1", IPs: []netip.Addr{ip("192.0.2.10")}}
	cc := NewCompiler(configFor(nft.IPv4), NewSlots())
	cur := map[model.ServicePortName]model.ServicePort{}
	var prev *nft.Ruleset
	var named, reused int
	for step := range 200 {
		for range 1 + r.IntN(4) {
			randomChange(r, all, cur)
		}
		moved := step%40 == 39
		if moved {
			node.Zone = fmt.Sprintf("zone-%d", step)
		}
		snap := &model.Snapshot{Node: node}
		for _, sp := range cur {
			snap.Services = append(snap.Services, &sp)
		}
		sort.Slice(snap.Services, func(i, j int) bool { return snap.Services[i].Name.Less(snap.Services[j].Name) })
		rs, _ := cc.Compile(snap)

		if prev == nil || (moved && len(prev.Parts) > 0) {
			if rs.DerivedFrom(prev) {
				t.Fatalf("step %d: change set trusted without a complete previous ruleset", step)
			}
		} else {
			if !rs.DerivedFrom(prev) {
				t.Fatalf("step %d: the ruleset is not derived from the previous one", step)
			}
			old := map[string]*nft.Part{}
			for _, p := range prev.Parts {
				old[p.Owner] = p
			}
			want := map[string]*nft.Part{}
			for _, p := range rs.Parts {
				if old[p.Owner] != p {
					want[p.Owner] = p
				} else {
					reused++
				}
				delete(old, p.Owner)
			}
			for owner := range old {
				want[owner] = nil
			}
			if !maps.Equal(rs.Changes.Parts, want) {
				t.Fatalf("step %d: change set names %v, want %v", step, owners(rs.Changes.Parts), owners(want))
			}
			named += len(want)
		}
		if prev != nil {
			// a change set speaks for the one ruleset it was derived from
			if older := prev.Changes.Since.Value(); older != nil && rs.DerivedFrom(older) {
				t.Fatalf("step %d: derived from the ruleset two calls back", step)
			}
			// a copy with other parts is not described by the copied change set
			cp := *rs
			cp.Parts = append([]*nft.Part(nil), rs.Parts...)
			if len(cp.Parts) > 0 && cp.DerivedFrom(prev) {
				t.Fatalf("step %d: a copy with another Parts slice is described", step)
			}
		}
		prev = rs
		cur = maps.Clone(cur)
	}
	if named == 0 || reused == 0 {
		t.Fatalf("walk too narrow: %d named, %d reused parts", named, reused)
	}
}

func owners(m map[string]*nft.Part) []string {
	out := make([]string, 0, len(m))
	for o, p := range m {
		if p == nil {
			o += "(removed)"
		}
		out = append(out, o)
	}
	sort.Strings(out)
	return out
}
