// Package leftovers finds the rules kube-proxy leaves in the kernel (its nftables-mode
// table, its chains in iptables-nft's tables) and warns about them at start: they hook
// where nftproxy's do. It reads the kernel through nft/kernel's table listing.
package leftovers

import (
	"fmt"
	"slices"
	"strings"

	"github.com/go-logr/logr"

	"github.com/nftproxy/nftproxy/internal/pipeline"
	"github.com/nftproxy/nftproxy/nft"
)

// TableLister lists a family's tables with their chains' names (kernel.Applier.Tables).
type TableLister interface {
	Tables(fam nft.Family) (map[string][]string, error)
}

// Leftover is a kube-proxy table, or kube-proxy's chains in an iptables-nft table,
// found in the kernel.
type Leftover struct {
	Family nft.Family
	Table  string
	Mode   string   // kube-proxy's mode that leaves it: "nftables", or "iptables" (or ipvs)
	Chains []string // kube-proxy's chains in it (all chains for its nftables table)
}

func (l Leftover) String() string {
	const show = 4
	chains := strings.Join(l.Chains[:min(len(l.Chains), show)], ", ")
	if len(l.Chains) > show {
		chains += fmt.Sprintf(" and %d more", len(l.Chains)-show)
	}
	plural := "s"
	if len(l.Chains) == 1 {
		plural = ""
	}
	return fmt.Sprintf("%s mode: table %s %s (%d chain%s: %s)", l.Mode, l.Family, l.Table, len(l.Chains), plural, chains)
}

// kubeProxyTable is kube-proxy's table in nftables mode (families ip and ip6).
const kubeProxyTable = "kube-proxy"

// Chains only kube-proxy creates in iptables and ipvs modes (pkg/proxy/iptables,
// pkg/proxy/ipvs). The kubelet's own KUBE-* chains (KUBE-KUBELET-CANARY,
// KUBE-FIREWALL, KUBE-IPTABLES-HINT, KUBE-MARK-DROP) are not kube-proxy's and stay.
var (
	kubeProxyChains = []string{
		"KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD",
		"KUBE-PROXY-FIREWALL", "KUBE-PROXY-CANARY", "KUBE-LOAD-BALANCER", "KUBE-NODE-PORT",
	}
	kubeProxyChainPrefixes = []string{"KUBE-SVC-", "KUBE-SVL-", "KUBE-SEP-", "KUBE-EXT-", "KUBE-FW-", "KUBE-XLB-"}
)

func isKubeProxyChain(name string) bool {
	if slices.Contains(kubeProxyChains, name) {
		return true
	}
	return slices.ContainsFunc(kubeProxyChainPrefixes, func(p string) bool { return strings.HasPrefix(name, p) })
}

// Find looks for kube-proxy's rules in the kernel: its nftables-mode
// table, and its chains in the ip/ip6 tables of iptables-nft (iptables and ipvs modes).
// Rules of iptables-legacy live outside nftables and are not seen.
func Find(tl TableLister) ([]Leftover, error) {
	var out []Leftover
	for _, fam := range pipeline.Families {
		tables, err := tl.Tables(fam)
		if err != nil {
			return out, err
		}
		names := make([]string, 0, len(tables))
		for t := range tables {
			names = append(names, t)
		}
		slices.Sort(names)
		for _, t := range names {
			if t == kubeProxyTable {
				out = append(out, Leftover{Family: fam, Table: t, Mode: "nftables", Chains: tables[t]})
				continue
			}
			var chains []string
			for _, c := range tables[t] {
				if isKubeProxyChain(c) {
					chains = append(chains, c)
				}
			}
			if len(chains) > 0 {
				out = append(out, Leftover{Family: fam, Table: t, Mode: "iptables", Chains: chains})
			}
		}
	}
	return out, nil
}

// Warn logs, at -v=0, kube-proxy rules still in the kernel and how to
// remove them. They hook where nftproxy's do and use the same 0x4000 mark, so a packet
// may be DNATed by kube-proxy's stale rules first, to endpoints that have gone.
func Warn(log logr.Logger, tl TableLister) {
	found, err := Find(tl)
	if err != nil {
		log.Error(err, "Cannot look for kube-proxy's leftover rules")
	}
	if len(found) == 0 {
		return
	}
	what := make([]string, len(found))
	var commands []string
	for i, l := range found {
		what[i] = l.String()
		if l.Mode == "nftables" {
			commands = append(commands, fmt.Sprintf("nft delete table %s %s", l.Family, l.Table))
		}
	}
	remove := "kube-proxy --cleanup (on this node, with your cluster's kube-proxy image; see docs/migrating.md)"
	if len(commands) == len(found) {
		remove += ", or: " + strings.Join(commands, "; ")
	}
	log.Info("WARNING: kube-proxy's rules are still in the kernel. They hook where nftproxy's do and use the same masquerade mark, "+
		"and nothing updates them: service traffic may be sent to endpoints that no longer exist. Remove them once nftproxy is ready on this node",
		"found", what, "remove", remove)
}
