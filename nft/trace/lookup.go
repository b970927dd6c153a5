package trace

import (
	"fmt"

	"github.com/nftproxy/nftproxy/nft"
)

// lookup finds the element of set name whose key is the concatenation of the packet's
// fields, comparing typed values exactly; nil when there is none. A found element is
// added to the current rule's matches.
func (tr *tracer) lookup(t *thread, name string, fields []nft.Field) (*nft.Element, error) {
	s := tr.sets[name]
	if s == nil {
		return nil, fmt.Errorf("set %s does not exist", name)
	}
	if len(fields) != len(s.Key) {
		return nil, fmt.Errorf("%d fields looked up in set %s, whose key has %d", len(fields), name, len(s.Key))
	}
	key := make([]nft.Value, len(fields))
	for i, f := range fields {
		v, err := t.field(f, s.Key[i])
		if err != nil {
			return nil, fmt.Errorf("set %s: %w", name, err)
		}
		key[i] = v
	}
	e := find(s, key)
	if e != nil {
		t.matched = append(t.matched, match(tr.fam, s, *e))
	}
	return e, nil
}

// field returns a packet field as a value of type want, which must be its type.
func (t *thread) field(f nft.Field, want nft.Datatype) (nft.Value, error) {
	var v nft.Value
	var have nft.Datatype
	switch f {
	case nft.FieldSaddr, nft.FieldDaddr, nft.FieldCtOrigDaddr:
		v, have = nft.Addr(t.pkt.Saddr), nft.TypeIPv4Addr
		if f == nft.FieldDaddr {
			v = nft.Addr(t.pkt.Daddr)
		}
		if f == nft.FieldCtOrigDaddr {
			v = nft.Addr(t.orig)
		}
		if t.pkt.Family == nft.IPv6 {
			have = nft.TypeIPv6Addr
		}
	case nft.FieldL4Proto:
		v, have = nft.Num(uint32(t.pkt.L4Proto)), nft.TypeInetProto
	case nft.FieldTHDport:
		v, have = nft.Num(uint32(t.pkt.Dport)), nft.TypeInetService
	default:
		return v, fmt.Errorf("unknown field %d", f)
	}
	if have != want {
		return v, fmt.Errorf("field %d has type %d, the key wants %d", f, have, want)
	}
	return v, nil
}

// find returns the element with exactly this key (in an interval set, the range holding
// it), or nil.
func find(s *nft.Set, key []nft.Value) *nft.Element {
	if s.Interval && len(key) == 1 {
		a := key[0].Addr()
		for i := range s.Elements {
			e := &s.Elements[i]
			if len(e.Key) == 1 && len(e.Data) == 1 && e.Key[0].Addr().Compare(a) <= 0 && a.Compare(e.Data[0].Addr()) <= 0 {
				return e
			}
		}
		return nil
	}
	for i := range s.Elements {
		if equalKey(s.Key, s.Elements[i].Key, key) {
			return &s.Elements[i]
		}
	}
	return nil
}

func equalKey(types []nft.Datatype, a, b []nft.Value) bool {
	if len(a) != len(types) || len(b) != len(types) {
		return false
	}
	for i, t := range types {
		switch t {
		case nft.TypeIPv4Addr, nft.TypeIPv6Addr:
			if a[i].Addr() != b[i].Addr() {
				return false
			}
		default:
			if a[i].Num() != b[i].Num() {
				return false
			}
		}
	}
	return true
}

func match(fam nft.Family, s *nft.Set, e nft.Element) Match {
	text := nft.RenderElementKey(s, e)
	if e.Comment != "" {
		text += fmt.Sprintf(" comment %q", e.Comment)
	}
	switch {
	case e.Verdict != nil:
		text += " : " + nft.RenderStmt(fam, *e.Verdict)
	case len(e.Data) > 0 && !s.Interval:
		text += " : " + renderData(s, e)
	}
	return Match{Set: s, Element: e, Text: text}
}

// renderData renders a map entry's value with the renderer's key function.
func renderData(s *nft.Set, e nft.Element) string {
	return nft.RenderElementKey(&nft.Set{Key: s.Data}, nft.Element{Key: e.Data})
}
