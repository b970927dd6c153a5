package kernel

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/wire"
)

// indexSets are sets whose keys have each of the index's key sizes (8 to 64 bytes, and
// lengths that are not a size: 2, 12, 28, 44).
func indexSets() []*nft.Set {
	v4, v6, proto, port, num := nft.TypeIPv4Addr, nft.TypeIPv6Addr, nft.TypeInetProto, nft.TypeInetService, nft.TypeNumgen
	keys := [][]nft.Datatype{
		{port}, {v4, v4}, {v4, proto, port}, {v4, proto, port, num}, {v6, proto, port},
		{v6, num, num}, {v6, v6}, {v6, proto, port, v6}, {v6, v6, v6, v6},
	}
	out := make([]*nft.Set, len(keys))
	for i, k := range keys {
		out[i] = &nft.Set{Name: fmt.Sprintf("s%d", i), Key: k, Data: []nft.Datatype{v4, port}}
	}
	return out
}

// indexElem is element i of set s: every field differs with i (addresses in their last
// byte, as zero padding would hide a difference at the end of a shorter key).
func indexElem(s *nft.Set, i int, port uint32) nft.Element {
	var e nft.Element
	for _, t := range s.Key {
		switch t {
		case nft.TypeIPv4Addr:
			e.Key = append(e.Key, nft.Addr(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)})))
		case nft.TypeIPv6Addr:
			e.Key = append(e.Key, nft.Addr(netip.AddrFrom16([16]byte{0xfd, 15: byte(i)})))
		default:
			e.Key = append(e.Key, nft.Num(uint32(i%200)))
		}
	}
	e.Data = []nft.Value{nft.Addr(netip.AddrFrom4([4]byte{10, 1, 0, 1})), nft.Num(port)}
	return e
}

// builtElements is an nft.ElementSource that builds copies of listed elements in the
// caller's buffer, as the compiler's sources build theirs.
type builtElements []nft.Element

func (b builtElements) Len() int { return len(b) }

func (b builtElements) Element(i int, buf *nft.ElementBuf) *nft.Element {
	e := b[i]
	n := copy(buf.Vals[:], e.Key)
	m := copy(buf.Vals[n:], e.Data)
	buf.Elem = e
	buf.Elem.Key, buf.Elem.Data = buf.Vals[:n:n], buf.Vals[n:n+m:n+m]
	if e.Data == nil {
		buf.Elem.Data = nil
	}
	return &buf.Elem
}

// TestElemIndex counts contributions through elemDelta for every key size: keys shared
// by two contributions, taken back one at a time, a changed value, and the undo after a
// refusal restoring the index as it was (a set's index dropped included); with
// elements listed and built on demand by a source.
func TestElemIndex(t *testing.T) {
	for _, built := range []bool{false, true} {
		for _, s := range indexSets() {
			t.Run(fmt.Sprintf("%s/built=%v", s.Name, built), func(t *testing.T) { testElemIndex(t, s, built) })
		}
	}
}

func testElemIndex(t *testing.T, s *nft.Set, built bool) {
	els := func(es []nft.Element) *nft.SetElements {
		if built {
			return &nft.SetElements{Set: s.Name, Source: builtElements(es)}
		}
		return &nft.SetElements{Set: s.Name, Elements: es}
	}
	const n = 50
	a, b := make([]nft.Element, n), make([]nft.Element, n)
	for i := range n {
		a[i], b[i] = indexElem(s, i, 80), indexElem(s, i, 80)
	}
	st := newState(nil)
	fresh := &elemDelta{st: st, before: map[string]map[string]*refElem{}}
	if err := fresh.add(s, els(a)); err != nil {
		t.Fatal(err)
	}
	if err := fresh.add(s, els(b[:n/2])); err != nil { // half the keys shared
		t.Fatal(err)
	}
	check := func(what string, want map[int]int32) {
		t.Helper()
		m := st.elems[s.Name]
		if len(want) == 0 {
			if m != nil {
				t.Fatalf("%s: %d keys left, want the set's index gone", what, m.len())
			}
			return
		}
		if m.len() != len(want) {
			t.Fatalf("%s: %d keys, want %d", what, m.len(), len(want))
		}
		for i, refs := range want {
			var k elemKey
			if err := k.encode(s, a[i].Key); err != nil {
				t.Fatal(err)
			}
			if r, ok := m.get(&k); !ok || r.refs != refs {
				t.Fatalf("%s: key %d: %v refs %d, want %d", what, i, ok, r.refs, refs)
			}
		}
	}
	all := map[int]int32{}
	for i := range n {
		all[i] = 1 + int32(1-i*2/n)
	}
	check("after adding", all)

	// one sync: the shared half taken back once, and key 0's element changed
	d := &elemDelta{st: st, before: map[string]map[string]*refElem{}}
	if err := d.remove(s, els(b[:n/2])); err != nil {
		t.Fatal(err)
	}
	if err := d.remove(s, els(a[:1])); err != nil {
		t.Fatal(err)
	}
	c := []nft.Element{indexElem(s, 0, 81)}
	cs := els(c)
	if err := d.add(s, cs); err != nil {
		t.Fatal(err)
	}
	one := map[int]int32{}
	for i := range n {
		one[i] = 1
	}
	check("after taking back", one)
	pl := &plan{recreated: map[string]bool{}}
	var stats Stats
	if err := pl.emit(wire.NewBatch(nft.IPv4, "t"), d, map[string]*nft.Set{s.Name: s}, &stats); err != nil {
		t.Fatal(err)
	}
	if stats.Elements != 2 { // key 0 deleted and added with its new value
		t.Errorf("%d element updates, want 2", stats.Elements)
	}
	var k0 elemKey
	if err := k0.encode(s, c[0].Key); err != nil {
		t.Fatal(err)
	}
	if r, _ := st.elems[s.Name].get(&k0); r.ref() != (elemRef{cs, 0}) {
		t.Fatal("key 0 does not have its new element")
	}
	u := &undo{st: st, parts: map[string]*nft.Part{}, d: d}
	u.apply()
	check("after the undo", all)

	// another sync takes everything back: the set's index goes, and comes back
	d = &elemDelta{st: st, before: map[string]map[string]*refElem{}}
	for _, es := range [][]nft.Element{a, b[:n/2]} {
		if err := d.remove(s, els(es)); err != nil {
			t.Fatal(err)
		}
	}
	if err := pl.emit(wire.NewBatch(nft.IPv4, "t"), d, map[string]*nft.Set{s.Name: s}, &Stats{}); err != nil {
		t.Fatal(err)
	}
	check("after taking all back", nil)
	(&undo{st: st, parts: map[string]*nft.Part{}, d: d}).apply()
	check("after the second undo", all)
}

// TestElemIndexKeyLength: a key whose length is not its set index's is an error, not an
// entry zero padding could confuse with another key.
func TestElemIndexKeyLength(t *testing.T) {
	sets := indexSets()
	short, long := sets[1], sets[2] // 8 and 12 bytes
	st := newState(nil)
	st.elems[long.Name] = newIndex(12, 0)
	d := &elemDelta{st: st, before: map[string]map[string]*refElem{}}
	err := d.add(&nft.Set{Name: long.Name, Key: short.Key}, &nft.SetElements{Set: long.Name, Elements: []nft.Element{indexElem(short, 1, 80)}})
	if err == nil || !strings.Contains(err.Error(), "key of 8 bytes") {
		t.Fatalf("got %v, want a key length error", err)
	}
}

// TestSameValue: elements with the same key are the same to the kernel when value and
// comment are.
func TestSameValue(t *testing.T) {
	s := indexSets()[2]
	v := func(kind nft.VerdictKind, chain string) *nft.Verdict { return &nft.Verdict{Kind: kind, Chain: chain} }
	base := indexElem(s, 1, 80)
	for _, c := range []struct {
		name string
		a, b nft.Element
		same bool
	}{
		{"equal", base, indexElem(s, 1, 80), true},
		{"data", base, indexElem(s, 1, 81), false},
		{"comment", base, nft.Element{Key: base.Key, Data: base.Data, Comment: "x"}, false},
		{"verdicts", nft.Element{Verdict: v(nft.Accept, "")}, nft.Element{Verdict: v(nft.Accept, "")}, true},
		{"verdict chain", nft.Element{Verdict: v(nft.Accept, "a")}, nft.Element{Verdict: v(nft.Accept, "b")}, false},
		{"verdict kind", nft.Element{Verdict: v(nft.Accept, "")}, nft.Element{Verdict: v(nft.Drop, "")}, false},
		{"verdict or not", nft.Element{Verdict: v(nft.Accept, "")}, nft.Element{}, false},
		{"no value", nft.Element{}, nft.Element{}, true},
	} {
		if got := sameValue(s, &c.a, &c.b); got != c.same {
			t.Errorf("%s: same %v, want %v", c.name, got, c.same)
		}
	}
}
