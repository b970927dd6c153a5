package compile

import (
	"slices"

	"github.com/nftproxy/nftproxy/internal/purpose"
	"github.com/nftproxy/nftproxy/nft"
)

// The fast path for established flows (--fast-path-interfaces): a flowtable on the
// node's chosen interfaces, and one rule in a forward chain of its own that adds to it
// the established flows nftproxy DNATed to a cluster IP's endpoint. From then on the
// flowtable's ingress hook forwards their packets on those interfaces, past every
// later netfilter hook of every table: no conntrack lookup, no NAT or filter chain.
// The kernel moves a flow back to the slow path when it ends (TCP FIN or RST), when
// its conntrack entry is deleted (as nftproxy deletes stale UDP flows) or when one of
// its interfaces goes away.

// FastPath is the fast path's configuration: Devices are the node's interfaces that
// match --fast-path-interfaces as they exist now (the caller resolves the patterns on
// every sync). No devices: no fast path, and nothing of it in the table.
type FastPath struct {
	Devices []string
}

const (
	// FlowtableFastPath is the flowtable's name.
	FlowtableFastPath = "fastpath"
	// ChainFilterForwardFastPath is the forward chain adding flows to it.
	ChainFilterForwardFastPath = "filter-forward-fastpath"
	// fastPathPriority is the chain's priority: after the usual filter priority (0),
	// so the forward filtering of every other table (and nftproxy's own checks) sees a
	// flow before it is offloaded.
	fastPathPriority = 10
)

// SetFastPath changes the fast path's devices of the rulesets compiled from now on;
// the rest of the configuration, and what was compiled of it, is kept.
func (cc *Compiler) SetFastPath(fp FastPath) { cc.cfg.FastPath = fp }

// fastPath returns the flowtable and its chain: "ct state established ct status dnat
// ct original ip daddr @cluster-ips flow add @fastpath", none without devices.
func (c *compiler) fastPath() ([]*nft.Flowtable, []*nft.Chain) {
	if len(c.cfg.FastPath.Devices) == 0 {
		return nil, nil
	}
	devs := slices.Compact(slices.Sorted(slices.Values(c.cfg.FastPath.Devices)))
	ft := &nft.Flowtable{Name: FlowtableFastPath, Devices: devs}
	ch := &nft.Chain{Name: ChainFilterForwardFastPath, Hook: &nft.Hook{Type: nft.TypeFilter, Hook: nft.Forward, Priority: fastPathPriority},
		Rules: []nft.Rule{{Stmts: []nft.Stmt{
			nft.MatchCtStateEstablished{},
			nft.MatchCtStatusDNAT{},
			nft.Lookup{Fields: []nft.Field{nft.FieldCtOrigDaddr}, Set: SetClusterIPs},
			nft.FlowOffload{Flowtable: FlowtableFastPath},
		}, Tag: purpose.Table(purpose.FastPath)}},
	}
	return []*nft.Flowtable{ft}, []*nft.Chain{ch}
}
