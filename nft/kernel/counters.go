package kernel

import (
	"encoding/binary"
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft"
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
	c, err := a.reader()
	if err != nil {
		return nil, err
	}
	t := &nftables.Table{Name: table, Family: nftables.TableFamily(fam)}
	s, err := c.GetSetByName(t, set)
	if err != nil {
		return nil, fmt.Errorf("reading set %s %s %s: %w", fam, table, set, err)
	}
	elems, err := c.GetSetElements(s)
	if err != nil {
		return nil, fmt.Errorf("reading elements of %s %s %s: %w", fam, table, set, err)
	}
	out := make([]Count, 0, len(elems))
	for _, e := range elems {
		if e.Counter != nil {
			out = append(out, Count{Comment: e.Comment, Packets: e.Counter.Packets, Bytes: e.Counter.Bytes})
		}
	}
	return out, nil
}

// RuleCounts reads the counters of the rules of a chain that have one.
func (a *Applier) RuleCounts(fam nft.Family, table, chain string) ([]Count, error) {
	c, err := a.reader()
	if err != nil {
		return nil, err
	}
	t := &nftables.Table{Name: table, Family: nftables.TableFamily(fam)}
	rules, err := c.GetRules(t, &nftables.Chain{Name: chain, Table: t})
	if err != nil {
		return nil, fmt.Errorf("reading rules of %s %s %s: %w", fam, table, chain, err)
	}
	var out []Count
	for _, r := range rules {
		for _, e := range r.Exprs {
			if ctr, ok := e.(*expr.Counter); ok {
				out = append(out, Count{Packets: ctr.Packets, Bytes: ctr.Bytes})
			}
		}
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
		msgs, err := dump(conn, fam, unix.NFT_MSG_GETSETELEM, func(ae *netlink.AttributeEncoder) {
			ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, table)
			ae.String(unix.NFTA_SET_ELEM_LIST_SET, set)
		})
		if err != nil {
			return nil, 0, fmt.Errorf("reading the counters of %s %s %s: %w", fam, table, set, err)
		}
		byKey := owners[set]
		for _, m := range msgs {
			if err := eachCounter(m, func(key []byte, packets, bytes uint64) {
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
				return nil, 0, fmt.Errorf("decoding the counters of %s %s %s: %w", fam, table, set, err)
			}
		}
	}
	return counts, unattributed, nil
}

// eachCounter calls fn with the key and counter of every element of a
// NFT_MSG_NEWSETELEM payload that has one. It walks the attributes in place: a
// read of 20,000 elements allocates nothing per element.
func eachCounter(payload []byte, fn func(key []byte, packets, bytes uint64)) error {
	return walkAttrs(payload, func(typ uint16, list []byte) error {
		if typ != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
			return nil
		}
		return walkAttrs(list, func(_ uint16, elem []byte) error {
			var key []byte
			var packets, bytes uint64
			found := false
			err := walkAttrs(elem, func(typ uint16, b []byte) error {
				switch typ {
				case unix.NFTA_SET_ELEM_KEY:
					return walkAttrs(b, func(typ uint16, v []byte) error {
						if typ == unix.NFTA_DATA_VALUE {
							key = v
						}
						return nil
					})
				case nftaSetElemExpr:
					packets, bytes, found = counterOf(b)
				case nftaSetElemExpressions:
					return walkAttrs(b, func(_ uint16, e []byte) error {
						if !found {
							packets, bytes, found = counterOf(e)
						}
						return nil
					})
				}
				return nil
			})
			if err == nil && found && key != nil {
				fn(key, packets, bytes)
			}
			return err
		})
	})
}

// counterOf decodes one expression: its packets and bytes if it is a counter.
func counterOf(b []byte) (packets, bytes uint64, ok bool) {
	var data []byte
	if walkAttrs(b, func(typ uint16, v []byte) error {
		switch typ {
		case unix.NFTA_EXPR_NAME:
			ok = cstring(v) == "counter"
		case unix.NFTA_EXPR_DATA:
			data = v
		}
		return nil
	}) != nil || !ok || data == nil {
		return 0, 0, false
	}
	err := walkAttrs(data, func(typ uint16, v []byte) error {
		if len(v) != 8 {
			return nil
		}
		switch typ {
		case unix.NFTA_COUNTER_PACKETS:
			packets = binary.BigEndian.Uint64(v)
		case unix.NFTA_COUNTER_BYTES:
			bytes = binary.BigEndian.Uint64(v)
		}
		return nil
	})
	return packets, bytes, err == nil
}

// walkAttrs calls fn with the type (flags cleared) and payload of each netlink
// attribute in b.
func walkAttrs(b []byte, fn func(typ uint16, data []byte) error) error {
	for len(b) >= 4 {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		if l < 4 || l > len(b) {
			return fmt.Errorf("malformed netlink attribute (length %d of %d bytes)", l, len(b))
		}
		if err := fn(binary.NativeEndian.Uint16(b[2:4])&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER), b[4:l]); err != nil {
			return err
		}
		b = b[min((l+3)&^3, len(b)):]
	}
	return nil
}

// applied is what an Applier last wrote successfully, published for readers on other
// goroutines (rulesets and parts are never modified once built).
type applied map[tableKey]*nft.Ruleset

// ownerIndex maps the keys of a table's counter sets to the owners of the parts that
// added them, for one applied ruleset.
type ownerIndex struct {
	rs   *nft.Ruleset
	sets map[string]map[string]string // set → encoded key → part owner
}

// owners returns the owner index of the given sets of a table as last applied,
// rebuilt only when the ruleset changed since the last call.
func (a *Applier) owners(fam nft.Family, table string, sets []string) map[string]map[string]string {
	var rs *nft.Ruleset
	if p := a.published.Load(); p != nil {
		rs = (*p)[tableKey{fam, table}]
	}
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
				for _, e := range se.Elements {
					if key, err := appendValues(kb[:0], s.Key, e.Key); err == nil {
						m[string(key)] = p.Owner
					}
				}
			}
		}
	}
	a.index[k] = ix
	return ix.sets
}
