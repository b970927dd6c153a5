package nft

import (
	"net/netip"
	"slices"
)

// MergeRanges returns the elements of an interval set holding the addresses of the
// prefixes (all of one family): the smallest list of ranges covering them, in address
// order, none overlapping or touching another (the kernel refuses overlaps, and a range
// ending just before the next would put two of its elements on one address).
func MergeRanges(prefixes []netip.Prefix) []Element {
	type span struct{ first, last netip.Addr }
	spans := make([]span, 0, len(prefixes))
	for _, p := range prefixes {
		p = p.Masked()
		spans = append(spans, span{p.Addr(), LastAddr(p)})
	}
	slices.SortFunc(spans, func(a, b span) int { return a.first.Compare(b.first) })
	var out []Element
	for i := 0; i < len(spans); {
		cur := spans[i]
		for i++; i < len(spans); i++ {
			n := spans[i]
			if next := cur.last.Next(); next.IsValid() && n.first.Compare(next) > 0 {
				break
			}
			if n.last.Compare(cur.last) > 0 {
				cur.last = n.last
			}
		}
		out = append(out, Element{Key: []Value{Addr(cur.first)}, Data: []Value{Addr(cur.last)}})
	}
	return out
}

// LastAddr is the last address of prefix p.
func LastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// RangePrefix returns the prefix whose addresses are exactly first…last, if there is one.
func RangePrefix(first, last netip.Addr) (netip.Prefix, bool) {
	for bits := 0; bits <= first.BitLen(); bits++ {
		p := netip.PrefixFrom(first, bits)
		if p.Masked().Addr() == first && LastAddr(p) == last {
			return p, true
		}
	}
	return netip.Prefix{}, false
}
