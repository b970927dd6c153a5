package nft

import (
	"strconv"
	"strings"
)

// A Part is what one owner (one service port) adds to a ruleset: its own chains and sets,
// and elements of the ruleset's shared sets. Keeping parts apart lets an incremental
// compiler reuse an unchanged owner's Part as is, and lets the kernel applier skip it by
// identity: a sync then costs in proportion to what changed, not to the table's size.
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

// A Tag says what a part, rule or set element is for, in the terms of the program that
// built the ruleset: nftproxy's compiler tags them with the service port they serve and
// their purpose (compile.Tag). nft only carries tags: the renderer and the kernel
// encoder never read them (comments are what a human reading "nft list" sees), and the
// kernel never stores them. They let the program's other readers — the controller, the
// metrics, explain — switch on types instead of parsing names and comments. A tag's
// dynamic type must be comparable; nil says nothing. String is for logs and errors.
type Tag interface{ String() string }

// SetElements are elements of one shared set.
type SetElements struct {
	Set      string
	Elements []Element
}

// Flatten returns the ruleset with its parts merged in: their sets and chains follow the
// ruleset's own regular chains (base chains stay last), and their elements are appended
// to the shared sets in part order, each key once. A ruleset without parts is returned
// as is.
func (rs *Ruleset) Flatten() *Ruleset {
	if len(rs.Parts) == 0 {
		return rs
	}
	out := &Ruleset{Family: rs.Family, Table: rs.Table}
	byName := map[string]*Set{}
	for _, s := range rs.Sets {
		c := *s
		c.Elements = append([]Element(nil), s.Elements...)
		byName[s.Name] = &c
		out.Sets = append(out.Sets, &c)
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
			for _, e := range se.Elements {
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
	for _, p := range rs.Parts {
		out.Sets = append(out.Sets, p.Sets...)
		out.Chains = append(out.Chains, p.Chains...)
	}
	out.Chains = append(out.Chains, base...)
	return out
}

func keyString(vs []Value) string {
	var b strings.Builder
	for _, v := range vs {
		if v.Addr.IsValid() {
			b.WriteString(v.Addr.String())
		} else {
			b.WriteString("#")
			b.WriteString(strconv.FormatUint(uint64(v.Num), 10))
		}
		b.WriteByte(' ')
	}
	return b.String()
}
