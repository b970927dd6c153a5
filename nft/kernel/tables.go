package kernel

import (
	"slices"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/wire"
)

// Tables lists the tables of family fam and the names of each one's chains, whoever
// owns them (read-only; for example to find another proxy's leftover rules).
// iptables-nft's tables (nat, filter, …) are nftables tables and are listed too.
func (a *Applier) Tables(fam nft.Family) (map[string][]string, error) {
	c, err := a.dial()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	tables, err := wire.TableNames(c, fam)
	if err != nil {
		return nil, err
	}
	out := make(map[string][]string, len(tables))
	for _, t := range tables {
		out[t] = []string{}
	}
	chains, err := wire.ChainNames(c, fam)
	if err != nil {
		return nil, err
	}
	for t, names := range chains {
		out[t] = append(out[t], names...)
	}
	for _, names := range out {
		slices.Sort(names)
	}
	return out, nil
}
