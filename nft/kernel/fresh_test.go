package kernel_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

// TestFullWriteSharedKeys: in a full write, a key that several parts contribute is added
// once; when two give it different values (the compiler never does), the kernel gets
// the last one counted, the one the applier's index keeps, even after many elements of
// the same set were already encoded; and a delta after it is accepted.
func TestFullWriteSharedKeys(t *testing.T) {
	addr := func(s string) nft.Value { return nft.Addr(netip.MustParseAddr(s)) }
	elem := func(k, v string) nft.Element {
		return nft.Element{Key: []nft.Value{addr(k)}, Data: []nft.Value{addr(v)}}
	}
	many := make([]nft.Element, 3000) // more than a message's worth before the clash
	for i := range many {
		many[i] = elem(netip.AddrFrom4([4]byte{10, 2, byte(i >> 8), byte(i)}).String(), "10.9.0.1")
	}
	rs := func(parts ...*nft.Part) *nft.Ruleset {
		return &nft.Ruleset{Family: nft.IPv4, Table: "freshtest", Parts: parts, Sets: []*nft.Set{
			{Name: "m", Key: []nft.Datatype{nft.TypeIPv4Addr}, Data: []nft.Datatype{nft.TypeIPv4Addr}},
			{Name: "s", Key: []nft.Datatype{nft.TypeIPv4Addr}},
		}}
	}
	a := &nft.Part{Owner: "a", Elements: []nft.SetElements{
		{Set: "m", Elements: append([]nft.Element{elem("10.1.0.1", "10.9.9.1")}, many...)},
		{Set: "s", Elements: []nft.Element{{Key: []nft.Value{addr("10.3.0.1")}}}},
	}}
	b := &nft.Part{Owner: "b", Elements: []nft.SetElements{
		{Set: "m", Elements: []nft.Element{elem("10.1.0.1", "10.9.9.2"), elem("10.1.0.2", "10.9.9.2")}},
		{Set: "s", Elements: []nft.Element{{Key: []nft.Value{addr("10.3.0.1")}}}}, // the same, shared
	}}
	ns := testnetns.New(t)
	ap := kernel.New(kernel.WithNetNS(ns.FD))
	st, err := ap.Apply(rs(a, b))
	if err != nil {
		t.Fatal(err)
	}
	if want := 3002 + 1; st.Elements != want {
		t.Errorf("full write added %d elements, want %d (each key once)", st.Elements, want)
	}
	m := ns.MustRun(t, "", "nft", "list", "map", "ip", "freshtest", "m")
	if !strings.Contains(m, "10.1.0.1 : 10.9.9.2") || strings.Contains(m, "10.9.9.1") {
		t.Errorf("the shared key does not have the last value counted:\n%.400s", m)
	}
	c := &nft.Part{Owner: "c", Elements: []nft.SetElements{{Set: "m", Elements: []nft.Element{elem("10.1.0.3", "10.9.9.3")}}}}
	if st, err := ap.Apply(rs(a, b, c)); err != nil || st.Full || st.Elements != 1 {
		t.Fatalf("delta after the full write: %+v, %v; want one element added", st, err)
	}
}
