package nft

import (
	"net/netip"
	"slices"
	"testing"
)

// pairs is an ElementSource of "a . a" elements for addresses 10.0.0.1..n, built in the
// caller's buffer.
type pairs int

func (p pairs) Len() int { return int(p) }

func (p pairs) Element(i int, buf *ElementBuf) *Element {
	a := Addr(netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)}))
	buf.Vals[0], buf.Vals[1] = a, a
	buf.Elem = Element{Key: buf.Vals[0:2:2]}
	return &buf.Elem
}

// TestElementSource: elements built on demand read as listed ones do, All's copies do
// not share the buffer they were built in, and Flatten merges them like listed elements
// (each key once).
func TestElementSource(t *testing.T) {
	built := SetElements{Set: "hairpin", Source: pairs(3)}
	if built.Len() != 3 {
		t.Fatalf("Len %d, want 3", built.Len())
	}
	all := built.All()
	var buf ElementBuf
	for i := range 3 {
		want := Addr(netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)}))
		if e := built.At(i, &buf); !slices.Equal(e.Key, []Value{want, want}) {
			t.Fatalf("At(%d) = %v", i, e.Key)
		}
		if !slices.Equal(all[i].Key, []Value{want, want}) {
			t.Fatalf("All()[%d] = %v: its key shares a buffer", i, all[i].Key)
		}
	}
	listed := SetElements{Set: "hairpin", Elements: []Element{all[2], {Key: []Value{Num(7), Num(7)}}}}
	if listed.Len() != 2 || listed.At(1, &buf) != &listed.Elements[1] {
		t.Fatal("a listed element is not returned in place")
	}

	rs := &Ruleset{Family: IPv4, Table: "t",
		Sets:  []*Set{{Name: "hairpin", Key: []Datatype{TypeIPv4Addr, TypeIPv4Addr}}},
		Parts: []*Part{{Owner: "a", Elements: []SetElements{built}}, {Owner: "b", Elements: []SetElements{listed}}}}
	flat := rs.Flatten()
	var got []string
	for _, e := range flat.Sets[0].Elements {
		got = append(got, keyString(e.Key))
	}
	want := []string{"10.0.0.1 10.0.0.1 ", "10.0.0.2 10.0.0.2 ", "10.0.0.3 10.0.0.3 ", "#7 #7 "}
	if !slices.Equal(got, want) {
		t.Fatalf("flattened %q, want %q", got, want)
	}
}
