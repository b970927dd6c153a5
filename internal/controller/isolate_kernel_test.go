package controller

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

// poisoningApplier is a real Applier that adds, to every part carrying endpoint
// 10.244.9.9, a chain that jumps to a chain that does not exist: the kernel itself
// refuses such a transaction.
type poisoningApplier struct{ *kernel.Applier }

func (a poisoningApplier) Apply(rulesets ...*nft.Ruleset) (kernel.Stats, error) {
	return a.Applier.Apply(poisoned(rulesets)...)
}

// poisoned returns the rulesets with, in every part carrying endpoint 10.244.9.9, a chain
// that goes to a chain that does not exist: the compiler never writes that, and the
// kernel (and so nft/fake) refuses it.
func poisoned(rulesets []*nft.Ruleset) []*nft.Ruleset {
	poison := netip.MustParseAddr("10.244.9.9")
	out := make([]*nft.Ruleset, len(rulesets))
	for i, rs := range rulesets {
		c := *rs
		c.Parts = slices.Clone(rs.Parts)
		for j, p := range c.Parts {
			for _, se := range p.Elements {
				if slices.ContainsFunc(se.All(), func(e nft.Element) bool { return len(e.Data) > 0 && e.Data[0].Addr() == poison }) {
					q := *p
					q.Chains = append(slices.Clone(p.Chains), &nft.Chain{Name: "poison-" + p.Owner, Rules: []nft.Rule{{Stmts: []nft.Stmt{nft.Verdict{Kind: nft.Goto, Chain: "no-such-chain"}}}}})
					c.Parts[j] = &q
					break
				}
			}
		}
		out[i] = &c
	}
	return out
}

// TestKernelRefusalIsIsolated is TestRefusedServiceIsIsolated against the kernel, in a
// throwaway network namespace: the refusal is real (ENOENT for the missing chain).
func TestKernelRefusalIsIsolated(t *testing.T) {
	ns := testnetns.New(t)
	client, _ := startProxyWith(t, poisoningApplier{kernel.New(kernel.WithNetNS(ns.FD))},
		service("a", "10.96.0.1"), slice("a", "a-1", "10.244.1.2"),
		service("bad", "10.96.0.3"), slice("bad", "bad-1", "10.244.1.4"))
	list := func() string { out, _ := ns.Run(t, "", "nft", "list", "table", "ip", "nftproxy"); return out }
	waitFor(t, "first sync in the kernel", func() bool { return strings.Contains(list(), "10.244.1.4 . 8080") })
	ctx := context.Background()
	for _, s := range []struct{ svc, name, addr string }{{"bad", "bad-1", "10.244.9.9"}, {"a", "a-1", "10.244.1.5"}} {
		if _, err := client.DiscoveryV1().EndpointSlices("default").Update(ctx, slice(s.svc, s.name, s.addr), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "a's change in the kernel despite bad's refused rules", func() bool { return strings.Contains(list(), "10.244.1.5 . 8080") })
	if out := list(); strings.Contains(out, "10.244.9.9") || !strings.Contains(out, "10.244.1.4 . 8080") {
		t.Fatalf("want bad's previous endpoint kept and the refused one absent:\n%s", out)
	}
}
