package kernel

import (
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

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
