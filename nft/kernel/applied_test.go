package kernel_test

import (
	"errors"
	"testing"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/fake"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

// Applied is what the last accepted transaction wrote: nothing before one, a new
// snapshot after each, the previous one kept when the kernel refuses a transaction,
// and every table the Applier wrote (one per family here).
func TestAppliedFollowsAcceptedTransactions(t *testing.T) {
	f := fake.New() // a real Applier, its batches answered by an in-memory nf_tables
	if got := f.Applied(); got != nil || got.Ruleset(nft.IPv4, "t") != nil || got.Rulesets() != nil {
		t.Fatalf("applied before any transaction: %v", got)
	}
	four := &nft.Ruleset{Family: nft.IPv4, Table: "t", Chains: []*nft.Chain{{Name: "a"}}}
	six := &nft.Ruleset{Family: nft.IPv6, Table: "t", Chains: []*nft.Chain{{Name: "a"}}}
	if _, err := f.Apply(four, six); err != nil {
		t.Fatal(err)
	}
	first := f.Applied()
	if first.Ruleset(nft.IPv4, "t") != four || first.Ruleset(nft.IPv6, "t") != six || first.Ruleset(nft.IPv4, "u") != nil {
		t.Fatalf("after the first transaction: %v", first.Rulesets())
	}
	if rs := first.Rulesets(); len(rs) != 2 || rs[0] != four || rs[1] != six {
		t.Fatalf("Rulesets: %v, want IPv4 then IPv6", rs)
	}
	bad := &nft.Ruleset{Family: nft.IPv4, Table: "t", Chains: []*nft.Chain{{Name: "a",
		Rules: []nft.Rule{{Stmts: []nft.Stmt{nft.Verdict{Kind: nft.Jump, Chain: "missing"}}}}}}}
	var rejected *kernel.RejectedError
	if _, err := f.Apply(bad, six); !errors.As(err, &rejected) {
		t.Fatalf("a jump to a missing chain: %v, want a refusal", err)
	}
	if f.Applied() != first {
		t.Fatal("a refused transaction changed what was applied")
	}
	next := &nft.Ruleset{Family: nft.IPv4, Table: "t", Chains: []*nft.Chain{{Name: "b"}}}
	if _, err := f.Apply(next); err != nil {
		t.Fatal(err)
	}
	now := f.Applied()
	if now == first || now.Ruleset(nft.IPv4, "t") != next || now.Ruleset(nft.IPv6, "t") != six {
		t.Fatalf("after the third transaction: %v", now.Rulesets())
	}
	if first.Ruleset(nft.IPv4, "t") != four {
		t.Fatal("an earlier snapshot changed")
	}
}
