package nft

import (
	"slices"
	"strconv"
	"strings"
	"weak"
)

// A Part is what one owner (one service port) adds to a ruleset: its own chains and sets,
// and elements of the ruleset's shared sets. Keeping parts apart lets an incremental
// compiler reuse an unchanged owner's Part as is, and lets the kernel applier skip it:
// a sync then costs in proportion to what changed, not to the table's size. How the
// compiler tells the applier which parts changed is PartChanges.
//
// Two parts may add the same key to a shared set (two services with the same endpoint
// in the hairpin set) only with identical elements; the set holds it once, for as long
// as any part adds it.
type Part struct {
	// Owner is the part's key: unique within the ruleset, it is how the kernel applier
	// matches a part with the one it last wrote. It is a name, not meaning: what the
	// part is for is in Tag.
	Owner    string
	Tag      Tag // what the part is for (nftproxy: the service port); never sent to the kernel
	Chains   []*Chain
	Sets     []*Set
	Elements []SetElements
}

// PartChanges is the contract between a program that derives a ruleset from a previous
// one (nftproxy: the incremental compile.Compiler) and a reader that keeps the previous
// one (the kernel applier): what changed, so the reader looks at those parts only.
//
//   - Since is the ruleset this one was derived from (a weak pointer: a chain of
//     rulesets, each naming the one before, would otherwise keep every one alive).
//   - Parts holds every owner whose part is not, pointer for pointer, the one in Since:
//     owner → its part in this ruleset (added or replaced), or nil (removed). Every
//     Part of the ruleset whose owner is not in Parts is the same *Part, under the same
//     owner, as in Since. A part named here may still be equal to the old one.
//   - The ruleset's own Sets and Chains are not covered: readers compare them.
//
// A reader may trust Parts only when DerivedFrom holds: Since is exactly the ruleset it
// holds, and the ruleset's Parts are still the slice the change set was made for (a copy
// of the ruleset with other parts, Changes copied along, is not described). Otherwise,
// and for the zero value, it compares every part. Parts are immutable once built, so
// "same pointer" means "same content".
type PartChanges struct {
	Since weak.Pointer[Ruleset]
	Parts map[string]*Part
	of    []*Part // the Parts of the ruleset described
}

// ChangesSince returns the change set of a ruleset whose Parts are of, derived from
// since; parts maps each owner whose part changed to its part in of (nil: removed).
func ChangesSince(since *Ruleset, of []*Part, parts map[string]*Part) PartChanges {
	return PartChanges{Since: weak.Make(since), Parts: parts, of: of}
}

// DerivedFrom reports whether rs.Changes states the changes from prev to rs: prev is not
// nil, is the very ruleset the change set was derived from, and rs's Parts are the ones
// it was made for.
func (rs *Ruleset) DerivedFrom(prev *Ruleset) bool {
	c := rs.Changes
	return prev != nil && c.Parts != nil && c.Since.Value() == prev &&
		len(c.of) == len(rs.Parts) && (len(c.of) == 0 || &c.of[0] == &rs.Parts[0])
}

// A Tag says what a part, rule or set element is for, in the terms of the program that
// built the ruleset: nftproxy's compiler tags them with the service port they serve and
// their purpose (purpose.Tag). nft only carries tags: the renderer and the kernel
// encoder never read them (comments are what a human reading "nft list" sees), and the
// kernel never stores them. They let the program's other readers — the controller, the
// metrics, explain — switch on types instead of parsing names and comments. A tag's
// dynamic type must be comparable; nil says nothing. String is for logs and errors.
type Tag interface{ String() string }

// SetElements are elements of one shared set: listed in Elements, or, when Source is
// set, produced by it on demand (Elements is then empty).
type SetElements struct {
	Set      string
	Elements []Element
	Source   ElementSource
}

// An ElementSource produces a run of elements from a compact description of them,
// instead of a program storing each: a service's endpoint entries are its endpoints
// numbered in order, and at 300,000 endpoints storing them as Elements took 130 MB.
// A source is immutable, like the part that holds it: element i is the same on every
// call.
type ElementSource interface {
	Len() int
	// Element returns element i, built in buf: it is valid until buf is used again.
	Element(i int, buf *ElementBuf) *Element
}

// ElementBuf is the room an ElementSource builds one element in.
type ElementBuf struct {
	Elem Element
	Vals [8]Value // its key's and value's fields, when they fit
}

// Len is the number of elements.
func (se *SetElements) Len() int {
	if se.Source != nil {
		return se.Source.Len()
	}
	return len(se.Elements)
}

// At returns element i: a listed one, or one built in buf (valid until buf is used
// again).
func (se *SetElements) At(i int, buf *ElementBuf) *Element {
	if se.Source != nil {
		return se.Source.Element(i, buf)
	}
	return &se.Elements[i]
}

// All returns the elements as ones the caller may keep: a built element is copied out
// of its buffer. For programs reading a ruleset as a whole (Flatten, tools, tests);
// a hot path iterates with At and one buffer.
func (se *SetElements) All() []Element {
	if se.Source == nil {
		return se.Elements
	}
	out := make([]Element, se.Len())
	var buf ElementBuf
	for i := range out {
		e := *se.At(i, &buf)
		e.Key = append([]Value(nil), e.Key...)
		if e.Data != nil {
			e.Data = append([]Value(nil), e.Data...)
		}
		out[i] = e
	}
	return out
}

// Flatten returns the ruleset with its parts merged in: their sets and chains follow the
// ruleset's own regular chains (base chains stay last), and their elements are appended
// to the shared sets in part order, each key once. A ruleset without parts is returned
// as is.
func (rs *Ruleset) Flatten() *Ruleset {
	if len(rs.Parts) == 0 {
		return rs
	}
	out := &Ruleset{Family: rs.Family, Table: rs.Table, Flowtables: rs.Flowtables}
	byName := map[string]*Set{}
	for _, s := range rs.Sets {
		c := *s
		c.Elements = append([]Element(nil), s.Elements...)
		byName[s.Name] = &c
		out.Sets = append(out.Sets, &c)
	}
	// a part's own sets (a source-range set) take its elements too
	var partSets []*Set
	for _, p := range rs.Parts {
		for _, s := range p.Sets {
			c := *s
			c.Elements = slices.Clip(s.Elements)
			if byName[s.Name] == nil {
				byName[s.Name] = &c
			}
			partSets = append(partSets, &c)
		}
	}
	seen := map[string]map[string]bool{}
	for _, p := range rs.Parts {
		for _, se := range p.Elements {
			s := byName[se.Set]
			if s == nil {
				continue // a part naming a set that does not exist is a compiler bug; Validate reports it
			}
			if seen[se.Set] == nil {
				seen[se.Set] = map[string]bool{}
				for _, e := range s.Elements {
					seen[se.Set][keyString(e.Key)] = true
				}
			}
			for _, e := range se.All() {
				k := keyString(e.Key)
				if !seen[se.Set][k] {
					seen[se.Set][k] = true
					s.Elements = append(s.Elements, e)
				}
			}
		}
	}
	var regular, base []*Chain
	for _, c := range rs.Chains {
		if c.Hook == nil {
			regular = append(regular, c)
		} else {
			base = append(base, c)
		}
	}
	out.Chains = regular
	out.Sets = append(out.Sets, partSets...)
	for _, p := range rs.Parts {
		out.Chains = append(out.Chains, p.Chains...)
	}
	out.Chains = append(out.Chains, base...)
	return out
}

func keyString(vs []Value) string {
	var b strings.Builder
	for _, v := range vs {
		if v.Addr().IsValid() {
			b.WriteString(v.Addr().String())
		} else {
			b.WriteString("#")
			b.WriteString(strconv.FormatUint(uint64(v.Num()), 10))
		}
		b.WriteByte(' ')
	}
	return b.String()
}
