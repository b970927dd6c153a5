package compile

import (
	"net/netip"

	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/nft"
)

// LocalMode is kube-proxy's --detect-local-mode: how traffic from the cluster's pods
// ("local" traffic) is told from other traffic. The values are kube-proxy's names.
type LocalMode string

// Local traffic detection modes.
const (
	// LocalClusterCIDR: pods' sources are in --cluster-cidr (kube-proxy's default).
	LocalClusterCIDR LocalMode = "ClusterCIDR"
	// LocalNodeCIDR: pods' sources are in this node's spec.podCIDRs.
	LocalNodeCIDR LocalMode = "NodeCIDR"
	// LocalBridgeInterface: pods' traffic enters through one bridge interface.
	LocalBridgeInterface LocalMode = "BridgeInterface"
	// LocalInterfaceNamePrefix: pods' traffic enters through interfaces whose names
	// begin with a prefix.
	LocalInterfaceNamePrefix LocalMode = "InterfaceNamePrefix"
)

// DetectLocal is the local-traffic check, as kube-proxy's LocalTrafficDetector: traffic
// to a cluster IP that is not local is masqueraded, and local traffic to an external
// address of a Local-policy service short-circuits to all its endpoints. The check may
// be unavailable in a family (ClusterCIDR without a CIDR of that family, NodeCIDR before
// the Node has a pod CIDR of it): then neither rule is written, as in kube-proxy.
type DetectLocal struct {
	Mode LocalMode // "" is ClusterCIDR
	// ClusterCIDRs are the ClusterCIDR mode's ranges, at most one per family.
	ClusterCIDRs []netip.Prefix
	// Interface is the BridgeInterface mode's interface, or the InterfaceNamePrefix
	// mode's name prefix.
	Interface string
}

// localCheck is DetectLocal resolved for one family and node: a source range, or an
// input interface name (or name prefix); neither when detection is unavailable.
type localCheck struct {
	cidr      netip.Prefix
	iface     string
	ifaceWild bool
}

// resolve gives the check of the family v6 on node.
func (d DetectLocal) resolve(v6 bool, node model.Node) localCheck {
	pick := func(cidrs []netip.Prefix) localCheck {
		for _, c := range cidrs {
			if c.Addr().Is6() == v6 {
				return localCheck{cidr: c.Masked()}
			}
		}
		return localCheck{}
	}
	switch d.Mode {
	case LocalNodeCIDR:
		return pick(node.PodCIDRs)
	case LocalBridgeInterface:
		return localCheck{iface: d.Interface}
	case LocalInterfaceNamePrefix:
		return localCheck{iface: d.Interface, ifaceWild: true}
	}
	return pick(d.ClusterCIDRs)
}

// ok reports whether local traffic can be told apart in this family.
func (l localCheck) ok() bool { return l.cidr.IsValid() || l.iface != "" }

// match returns the statement matching local traffic (local) or other traffic (!local).
func (l localCheck) match(local bool) nft.Stmt {
	op := nft.OpEq
	if !local {
		op = nft.OpNeq
	}
	if l.iface != "" {
		return nft.MatchIifname{Op: op, Name: l.iface, Prefix: l.ifaceWild}
	}
	return nft.MatchPrefix{Field: nft.FieldSaddr, Op: op, Prefix: l.cidr}
}
