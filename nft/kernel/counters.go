package kernel

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/wire"
)

// Count is the packet and byte count of one counted set element or rule, with its
// comment (which names the service).
type Count struct {
	Comment string
	Packets uint64
	Bytes   uint64
}

// SetCounts reads the counters of every element of a counter set.
func (a *Applier) SetCounts(fam nft.Family, table, set string) ([]Count, error) {
	c, err := a.dial()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	var out []Count
	err = wire.SetElemCounters(c, fam, table, set, func(_ []byte, comment string, packets, bytes uint64) {
		out = append(out, Count{Comment: comment, Packets: packets, Bytes: bytes})
	})
	return out, err
}

// RuleCounts reads the counters of the rules of a chain that have one.
func (a *Applier) RuleCounts(fam nft.Family, table, chain string) ([]Count, error) {
	c, err := a.dial()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	packets, bytes, err := wire.RuleCounters(c, fam, table, chain)
	if err != nil {
		return nil, err
	}
	out := make([]Count, len(packets))
	for i := range packets {
		out[i] = Count{Packets: packets[i], Bytes: bytes[i]}
	}
	return out, nil
}

// OwnerCount is the packet and byte count of the counter set elements one part added
// (nft.Part.Owner: one service port), summed over the sets read.
type OwnerCount struct {
	Owner   string
	Packets uint64
	Bytes   uint64
}

// CountersByOwner reads the element counters of the given counter sets of a table in
// one pass (one netlink dump per set, on one socket) and attributes each element to
// the part that added it, by the element's key, as the Applier last wrote the table:
// not by its comment, which the kernel cuts at 128 bytes. Elements the Applier did not
// write (or no part added) are left out; unattributed says how many. It is safe to
// call while another goroutine applies.
func (a *Applier) CountersByOwner(fam nft.Family, table string, sets ...string) (counts []OwnerCount, unattributed int, err error) {
	owners := a.owners(fam, table, sets)
	conn, err := a.dial()
	if err != nil {
		return nil, 0, err
	}
	defer conn.Close()
	index := map[string]int{}
	for _, set := range sets {
		byKey := owners[set]
		if err := wire.SetElemCounters(conn, fam, table, set, func(key []byte, _ string, packets, bytes uint64) {
			owner, ok := byKey[string(key)]
			if !ok {
				unattributed++
				return
			}
			i, seen := index[owner]
			if !seen {
				i = len(counts)
				index[owner] = i
				counts = append(counts, OwnerCount{Owner: owner})
			}
			counts[i].Packets += packets
			counts[i].Bytes += bytes
		}); err != nil {
			return nil, 0, fmt.Errorf("reading the counters: %w", err)
		}
	}
	return counts, unattributed, nil
}

// Applied is what an Applier last wrote successfully: the ruleset of each table, as
// given to Apply. A snapshot never changes (nor do rulesets and parts once built);
// Applier.Applied returns a new one after each accepted transaction, so readers on
// other goroutines may compare snapshots by pointer to see whether anything changed.
type Applied struct {
	tables map[tableKey]*nft.Ruleset
	order  []*nft.Ruleset // by family, then table
}

// AppliedOf is the snapshot of rulesets as if an Applier had just written them (one per
// table; a later one for the same table wins).
func AppliedOf(rulesets ...*nft.Ruleset) *Applied {
	p := &Applied{tables: map[tableKey]*nft.Ruleset{}}
	for _, rs := range rulesets {
		p.tables[tableKey{rs.Family, rs.Table}] = rs
	}
	for _, rs := range p.tables {
		p.order = append(p.order, rs)
	}
	slices.SortFunc(p.order, func(a, b *nft.Ruleset) int {
		if a.Family != b.Family {
			return cmp.Compare(a.Family, b.Family)
		}
		return cmp.Compare(a.Table, b.Table)
	})
	return p
}

// Ruleset is the ruleset last written to a table; nil if none (or p is nil).
func (p *Applied) Ruleset(fam nft.Family, table string) *nft.Ruleset {
	if p == nil {
		return nil
	}
	return p.tables[tableKey{fam, table}]
}

// Rulesets are the rulesets last written, by family and table (nil if p is nil). The
// slice is the caller's; the rulesets must not be modified.
func (p *Applied) Rulesets() []*nft.Ruleset {
	if p == nil {
		return nil
	}
	return slices.Clone(p.order)
}

// Applied returns what the Applier last wrote successfully; nil before its first
// accepted transaction. It is safe to call while another goroutine applies.
func (a *Applier) Applied() *Applied { return a.published.Load() }

// ownerIndex maps the keys of a table's counter sets to the owners of the parts that
// added them, for one applied ruleset.
type ownerIndex struct {
	rs   *nft.Ruleset
	sets map[string]map[string]string // set → encoded key → part owner
}

// owners returns the owner index of the given sets of a table as last applied,
// rebuilt only when the ruleset changed since the last call.
func (a *Applier) owners(fam nft.Family, table string, sets []string) map[string]map[string]string {
	rs := a.Applied().Ruleset(fam, table)
	a.indexMu.Lock()
	defer a.indexMu.Unlock()
	if a.index == nil {
		a.index = map[tableKey]*ownerIndex{}
	}
	k := tableKey{fam, table}
	if ix := a.index[k]; ix != nil && ix.rs == rs && len(ix.sets) == len(sets) {
		return ix.sets
	}
	ix := &ownerIndex{rs: rs, sets: map[string]map[string]string{}}
	for _, set := range sets {
		ix.sets[set] = map[string]string{}
	}
	if rs != nil {
		defs := map[string]*nft.Set{}
		for _, s := range rs.Sets {
			defs[s.Name] = s
		}
		var kb [64]byte
		for _, p := range rs.Parts {
			for _, se := range p.Elements {
				m, s := ix.sets[se.Set], defs[se.Set]
				if m == nil || s == nil {
					continue
				}
				for _, e := range se.All() {
					if key, err := wire.AppendValues(kb[:0], s.Key, e.Key); err == nil {
						m[string(key)] = p.Owner
					}
				}
			}
		}
	}
	a.index[k] = ix
	return ix.sets
}
