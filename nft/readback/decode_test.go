package readback_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/wire"
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

func checkDecodes(t *testing.T, st *wire.TableState, want *nft.Ruleset) {
	t.Helper()
	got, undecoded := wire.Decode(st)
	if len(undecoded) > 0 {
		t.Fatalf("undecoded rules: %v", undecoded)
	}
	// a dynamic set created without a size reads back with the kernel's default
	// maximum (nft_dynset gives 65535 when a rule binds it; its hash table is not
	// sized by it)
	for _, s := range got.Sets {
		if s.Dynamic && s.Size == 65535 {
			for _, ws := range want.Flatten().Sets {
				if ws.Name == s.Name && ws.Size == 0 {
					s.Size = 0
				}
			}
		}
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
			st, err := wire.EncodeState(tc.rs)
			if err != nil {
				t.Fatal(err)
			}
			checkDecodes(t, st, tc.rs)
		})
	}
}

func mustCompile(rs *nft.Ruleset, _ any) *nft.Ruleset { return rs }

// TestDecodeKernel applies compiled rulesets in a throwaway namespace, reads them back
// and decodes them: the kernel's dump decodes to the same chains and sets.
func TestDecodeKernel(t *testing.T) {
	ns := testnetns.New(t)
	a := newApplier(ns)
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
