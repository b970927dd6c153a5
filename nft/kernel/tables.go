package kernel

import (
	"fmt"
	"slices"

	"github.com/google/nftables"

	"github.com/nftproxy/nftproxy/nft"
)

// Tables lists the tables of family fam and the names of each one's chains, whoever
// owns them (read-only; for example to find another proxy's leftover rules).
// iptables-nft's tables (nat, filter, …) are nftables tables and are listed too.
func (a *Applier) Tables(fam nft.Family) (map[string][]string, error) {
	c, err := a.reader()
	if err != nil {
		return nil, err
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamily(fam))
	if err != nil {
		return nil, fmt.Errorf("listing %s tables: %w", fam, err)
	}
	out := make(map[string][]string, len(tables))
	for _, t := range tables {
		out[t.Name] = []string{}
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamily(fam))
	if err != nil {
		return nil, fmt.Errorf("listing %s chains: %w", fam, err)
	}
	for _, ch := range chains {
		if ch.Table != nil {
			out[ch.Table.Name] = append(out[ch.Table.Name], ch.Name)
		}
	}
	for _, names := range out {
		slices.Sort(names)
	}
	return out, nil
}
