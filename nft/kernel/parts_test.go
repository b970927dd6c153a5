package kernel_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

// TestPartsIncrementalEqualsFresh drives one Applier with the incremental compiler's
// rulesets (with parts) through a random walk of service changes, and checks after every
// step that the kernel holds exactly what a fresh, full apply of the flattened ruleset
// holds; and that a sync with no change sends nothing but the table message.
func TestPartsIncrementalEqualsFresh(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	inc := testnetns.New(t)
	applier := kernel.New(kernel.WithNetNS(inc.FD))
	cc := compile.NewCompiler(cfg(), compile.NewSlots())
	cur := map[string]model.ServicePort{}
	for step := range 40 {
		for range 1 + r.IntN(3) {
			name := fmt.Sprintf("s%d", r.IntN(8))
			if _, ok := cur[name]; ok && r.IntN(4) == 0 {
				delete(cur, name)
				continue
			}
			// endpoints overlap between services, so hairpin elements are shared
			sp := svc(name, fmt.Sprintf("10.96.0.%d", 1+r.IntN(8)), uint16(30000+r.IntN(4)), r.IntN(6), r.IntN(5))
			if r.IntN(4) == 0 {
				sp.AffinityTimeout = uint32(10 + r.IntN(2))
			}
			if r.IntN(4) == 0 {
				sp.ExternalPolicyLocal = true
			}
			cur[name] = sp
		}
		snap := &model.Snapshot{}
		for _, sp := range cur {
			snap.Services = append(snap.Services, &sp)
		}
		sort.Slice(snap.Services, func(i, j int) bool { return snap.Services[i].Name.Less(snap.Services[j].Name) })
		rs, _ := cc.Compile(snap)
		if step%5 == 4 && len(rs.Parts) > 0 {
			// the kernel refuses a transaction with one bad part: the applier must
			// still know what the kernel has, so that the next delta is right
			bad := *rs
			bad.Parts = slices.Clone(rs.Parts)
			i := r.IntN(len(bad.Parts))
			p := *bad.Parts[i]
			p.Chains = append(slices.Clone(p.Chains), &nft.Chain{Name: "broken-" + p.Owner, Rules: []nft.Rule{{Stmts: []nft.Stmt{nft.Verdict{Kind: nft.Goto, Chain: "no-such-chain"}}}}})
			bad.Parts[i] = &p
			var rejected *kernel.RejectedError
			if _, err := applier.Apply(&bad); !errors.As(err, &rejected) {
				t.Fatalf("step %d: bad part: got %v, want a refusal", step, err)
			}
		}
		st, err := applier.Apply(rs)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if st.Full != (step == 0) { // also after a refusal: the kernel kept its table
			t.Errorf("step %d: Full=%v", step, st.Full)
		}
		fresh := testnetns.New(t)
		if _, err := kernel.New(kernel.WithNetNS(fresh.FD)).Apply(rs.Flatten()); err != nil {
			t.Fatalf("step %d fresh apply: %v", step, err)
		}
		if got, want := listTable(t, inc), listTable(t, fresh); got != want {
			t.Fatalf("step %d: incremental result differs from fresh apply\n--- fresh:\n%s\n--- incremental:\n%s", step, want, got)
		}
		again, _ := cc.Compile(snap)
		if st, err := applier.Apply(again); err != nil || st.Messages != 1 || st.Elements != 0 || st.Chains != 0 {
			t.Fatalf("step %d: unchanged sync sent %+v (%v), want only the table message", step, st, err)
		}
	}
}
