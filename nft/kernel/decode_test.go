package kernel_test

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

// renderedParts renders every chain and set of a ruleset on its own, sorted by name,
// so that two rulesets with the same objects in another order compare equal.
func renderedParts(rs *nft.Ruleset) []string {
	rs = rs.Flatten()
	var out []string
	for _, s := range rs.Sets {
		c := *s
		c.Elements = slices.Clone(s.Elements)
		slices.SortFunc(c.Elements, func(a, b nft.Element) int {
			return strings.Compare(nft.RenderElementKey(&c, a), nft.RenderElementKey(&c, b))
		})
		one := &nft.Ruleset{Family: rs.Family, Table: rs.Table, Sets: []*nft.Set{&c}}
		out = append(out, nft.Render(one))
	}
	for _, c := range rs.Chains {
		one := &nft.Ruleset{Family: rs.Family, Table: rs.Table, Chains: []*nft.Chain{c}}
		out = append(out, nft.Render(one))
	}
	slices.Sort(out)
	return out
}

func checkDecodes(t *testing.T, st *kernel.TableState, want *nft.Ruleset) {
	t.Helper()
	got, undecoded := kernel.Decode(st)
	if len(undecoded) > 0 {
		t.Fatalf("undecoded rules: %v", undecoded)
	}
	// dynamic sets' elements are learned by the kernel; the compiled ones have none
	g, w := renderedParts(got), renderedParts(want)
	if !slices.Equal(g, w) {
		for i := range max(len(g), len(w)) {
			var a, b string
			if i < len(g) {
				a = g[i]
			}
			if i < len(w) {
				b = w[i]
			}
			if a != b {
				t.Errorf("decoded:\n%s\nwant:\n%s", a, b)
			}
		}
	}
}

// TestDecodeEncoded decodes what the compiled rulesets (every object kind, IPv4 and
// IPv6) encode to: every chain and set renders as the original.
func TestDecodeEncoded(t *testing.T) {
	for _, tc := range []struct {
		name string
		rs   *nft.Ruleset
	}{
		{"ipv4", mustCompile(compile.Compile(verifySnapshot(), cfg(), compile.NewSlots()))},
		{"ipv6", mustCompile(compile.Compile(verifySnapshot6(), cfg6(), compile.NewSlots()))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := kernel.EncodeState(tc.rs)
			if err != nil {
				t.Fatal(err)
			}
			checkDecodes(t, st, tc.rs)
		})
	}
}

func mustCompile(rs *nft.Ruleset, _ any) *nft.Ruleset { return rs }

// TestDecodeEveryStatement round-trips each statement kind alone, in both families, and
// a rule that is not an encoding of any statement is reported, not guessed.
func TestDecodeEveryStatement(t *testing.T) {
	for _, fam := range []nft.Family{nft.IPv4, nft.IPv6} {
		for _, s := range nft.AllStmtKinds() {
			if fam == nft.IPv6 {
				switch m := s.(type) {
				case nft.MatchPrefix:
					s = nft.MatchPrefix{Field: m.Field, Op: m.Op, Prefix: netip.MustParsePrefix("fd00::/13")}
				case nft.DNATTo:
					s = nft.DNATTo{Addr: netip.MustParseAddr("fd00::1"), Port: m.Port}
				}
			}
			rule := nft.Rule{Stmts: []nft.Stmt{s}, Comment: "c"}
			rs := &nft.Ruleset{Family: fam, Table: "t", Chains: []*nft.Chain{{Name: "x", Rules: []nft.Rule{rule}}}}
			st, err := kernel.EncodeState(rs)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := kernel.DecodeRule(fam, st.Chains["x"].Rules[0])
			if !ok || nft.RenderRule(fam, got) != nft.RenderRule(fam, rule) {
				t.Errorf("%s %T: decoded %q (ok %v), want %q", fam, s, nft.RenderRule(fam, got), ok, nft.RenderRule(fam, rule))
			}
		}
	}
	// the prefix bytes of "ip saddr 10.0.0.0/8" with a length the encoder never uses
	rs := &nft.Ruleset{Family: nft.IPv4, Table: "t", Chains: []*nft.Chain{{Name: "x", Rules: []nft.Rule{{Stmts: []nft.Stmt{
		nft.MatchPrefix{Field: nft.FieldSaddr, Prefix: netip.MustParsePrefix("10.0.0.0/8")}}}}}}}
	st, _ := kernel.EncodeState(rs)
	r := st.Chains["x"].Rules[0]
	r.Exprs = slices.Clone(r.Exprs)
	r.Exprs[0].Attrs = map[uint16][]byte{}
	for k, v := range st.Chains["x"].Rules[0].Exprs[0].Attrs {
		r.Exprs[0].Attrs[k] = v
	}
	r.Exprs[0].Attrs[3] = []byte{0, 0, 0, 3} // NFTA_PAYLOAD_LEN
	if got, ok := kernel.DecodeRule(nft.IPv4, r); ok {
		t.Errorf("a payload of 3 bytes against 1 compared decoded as %q", nft.RenderRule(nft.IPv4, got))
	}
}

// TestDecodeKernel applies compiled rulesets in a throwaway namespace, reads them back
// and decodes them: the kernel's dump decodes to the same chains and sets.
func TestDecodeKernel(t *testing.T) {
	ns := testnetns.New(t)
	a := kernel.New(kernel.WithNetNS(ns.FD))
	for _, rs := range []*nft.Ruleset{
		mustCompile(compile.Compile(verifySnapshot(), cfg(), compile.NewSlots())),
		mustCompile(compile.Compile(verifySnapshot6(), cfg6(), compile.NewSlots())),
	} {
		if _, err := a.Apply(rs); err != nil {
			t.Fatal(err)
		}
		st, err := a.ReadBack(rs.Family, rs.Table)
		if err != nil {
			t.Fatal(err)
		}
		checkDecodes(t, st, rs)
		if !strings.Contains(strings.Join(renderedParts(rs), ""), "dnat") {
			t.Fatal("test ruleset has no dnat rule")
		}
	}
}
