package compile

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/nft"
)

// The masquerading chain with --no-masquerade-cidrs: one return per range of the
// family, after the mark is cleared (so the packet leaves unmarked) and before the
// masquerade; the hairpin rule stays first, so an endpoint reaching itself is still
// masqueraded. Without the option the chain is kube-proxy's.
func TestNoMasquerade(t *testing.T) {
	snap := scenarios()["clusterip-2ep"]
	for _, tc := range []struct {
		fam  nft.Family
		want []string // the chain's rules, in order
	}{
		{nft.IPv4, []string{"hairpin", "mark unset: return", "clear mark", "ip daddr 10.244.5.0/24 return", "ip daddr 192.0.2.128/25 return", "masquerade"}},
		{nft.IPv6, []string{"hairpin", "mark unset: return", "clear mark", "ip6 daddr fd00:244:5::/64 return", "masquerade"}},
	} {
		cfg := testConfig()
		cfg.Family = tc.fam
		cfg.NoMasquerade = []netip.Prefix{netip.MustParsePrefix("10.244.5.0/24"), netip.MustParsePrefix("fd00:244:5::/64"), netip.MustParsePrefix("192.0.2.200/25")}
		rs, _ := Compile(snap, cfg, NewSlots())
		ch := chainNamed(rs, ChainMasquerading)
		if ch == nil {
			t.Fatalf("%s: no %s chain", tc.fam, ChainMasquerading)
		}
		var got []string
		for _, r := range ch.Rules {
			text := nft.RenderRule(tc.fam, nft.Rule{Stmts: r.Stmts})
			switch {
			case strings.Contains(text, "@"+SetHairpin):
				got = append(got, "hairpin")
			case len(r.Stmts) == 2 && isReturn(r.Stmts[1]) && isMarkUnset(r.Stmts[0]):
				got = append(got, "mark unset: return")
			case len(r.Stmts) == 1 && isXor(r.Stmts[0]):
				got = append(got, "clear mark")
			case len(r.Stmts) == 1 && isMasq(r.Stmts[0]):
				got = append(got, "masquerade")
			default:
				got = append(got, strings.TrimSpace(text))
			}
		}
		if strings.Join(got, " | ") != strings.Join(tc.want, " | ") {
			t.Errorf("%s: masquerading chain:\n got %q\nwant %q\n%s", tc.fam, got, tc.want, nft.Render(rs))
		}
	}
	// Without the option: kube-proxy's four rules.
	rs, _ := Compile(snap, testConfig(), NewSlots())
	if n := len(chainNamed(rs, ChainMasquerading).Rules); n != 4 {
		t.Errorf("without --no-masquerade-cidrs: %d rules in %s, want 4", n, ChainMasquerading)
	}
}

func isReturn(s nft.Stmt) bool    { v, ok := s.(nft.Verdict); return ok && v.Kind == nft.Return }
func isMarkUnset(s nft.Stmt) bool { _, ok := s.(nft.MatchMarkUnset); return ok }
func isXor(s nft.Stmt) bool       { m, ok := s.(nft.SetMarkBits); return ok && m.Xor }
func isMasq(s nft.Stmt) bool      { _, ok := s.(nft.Masquerade); return ok }

// TestMasqueradeToNodeIP: marked traffic is source-NATed to the node's primary IP of the
// family; hairpin traffic is still masqueraded; without a primary IP of the family, or
// without the option, marked traffic is masqueraded.
func TestMasqueradeToNodeIP(t *testing.T) {
	snap := *scenarios()["clusterip-2ep"] // node-1, 192.0.2.10 only
	for _, tc := range []struct {
		fam  nft.Family
		on   bool
		want string
	}{
		{nft.IPv4, true, "snat ip to 192.0.2.10 fully-random"},
		{nft.IPv6, true, "masquerade fully-random"}, // no IPv6 primary IP
		{nft.IPv4, false, "masquerade fully-random"},
	} {
		cfg := testConfig()
		cfg.Family, cfg.MasqueradeToNodeIP = tc.fam, tc.on
		rs, _ := Compile(&snap, cfg, NewSlots())
		rules := chainNamed(rs, ChainMasquerading).Rules
		if got := nft.RenderRule(tc.fam, nft.Rule{Stmts: rules[len(rules)-1].Stmts}); got != tc.want {
			t.Errorf("%s, option %v: last masquerading rule %q, want %q", tc.fam, tc.on, got, tc.want)
		}
		if hp := nft.RenderRule(tc.fam, nft.Rule{Stmts: rules[0].Stmts}); !strings.HasSuffix(hp, "masquerade fully-random") {
			t.Errorf("%s, option %v: hairpin rule %q is not masqueraded", tc.fam, tc.on, hp)
		}
	}
	// the Node's address changes: the rule follows on an incremental compiler
	cfg := testConfig()
	cfg.MasqueradeToNodeIP = true
	c := NewCompiler(cfg, NewSlots())
	c.Compile(&snap)
	moved := snap
	moved.Node.IPs = []netip.Addr{netip.MustParseAddr("192.0.2.11")}
	rs, _ := c.Compile(&moved)
	if !strings.Contains(nft.Render(rs.Flatten()), "snat ip to 192.0.2.11 fully-random") {
		t.Errorf("after the node's address changed:\n%s", nft.Render(rs.Flatten()))
	}
}
