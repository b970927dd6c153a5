package wire_test

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/wire"
)

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
				case nft.SNATTo:
					s = nft.SNATTo{Addr: netip.MustParseAddr("fd00::1")}
				}
			}
			rule := nft.Rule{Stmts: []nft.Stmt{s}, Comment: "c"}
			rs := &nft.Ruleset{Family: fam, Table: "t", Chains: []*nft.Chain{{Name: "x", Rules: []nft.Rule{rule}}}}
			st, err := wire.EncodeState(rs)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := wire.DecodeRule(fam, st.Chains["x"].Rules[0])
			if !ok || nft.RenderRule(fam, got) != nft.RenderRule(fam, rule) {
				t.Errorf("%s %T: decoded %q (ok %v), want %q", fam, s, nft.RenderRule(fam, got), ok, nft.RenderRule(fam, rule))
			}
		}
	}
	// the prefix bytes of "ip saddr 10.0.0.0/8" with a length the encoder never uses
	rs := &nft.Ruleset{Family: nft.IPv4, Table: "t", Chains: []*nft.Chain{{Name: "x", Rules: []nft.Rule{{Stmts: []nft.Stmt{
		nft.MatchPrefix{Field: nft.FieldSaddr, Prefix: netip.MustParsePrefix("10.0.0.0/8")}}}}}}}
	st, _ := wire.EncodeState(rs)
	r := st.Chains["x"].Rules[0]
	r.Exprs = slices.Clone(r.Exprs)
	r.Exprs[0].Attrs = map[uint16][]byte{}
	for k, v := range st.Chains["x"].Rules[0].Exprs[0].Attrs {
		r.Exprs[0].Attrs[k] = v
	}
	r.Exprs[0].Attrs[3] = []byte{0, 0, 0, 3} // NFTA_PAYLOAD_LEN
	if got, ok := wire.DecodeRule(nft.IPv4, r); ok {
		t.Errorf("a payload of 3 bytes against 1 compared decoded as %q", nft.RenderRule(nft.IPv4, got))
	}
}
