package conntrack

import (
	"slices"

	"github.com/nftproxy/nftproxy/internal/model"
)

// Escaped returns the conntrack entries of connections that escaped the proxy's NAT
// while its table was missing or broken (deleted or changed by another process until
// the repair), to delete once the repaired table is committed: for every service port
// of snap, whatever its protocol (TCP, UDP, SCTP), the entries to each of its cluster
// IPs and its port that nothing DNATed (their reply source is the cluster IP itself).
// Sorted, without duplicates; nil if snap is nil.
//
// Such an entry outlives the repair (an unanswered TCP SYN's for 120 s): a new
// connection from the same client port matches it, skips NAT again and is refused by
// the table's cluster-IP check. A connection the table handles is DNATed to an
// endpoint, or dropped or rejected, which leaves no entry, so no live connection
// through the proxy is selected. Only cluster IPs: an external or load-balancer IP may
// be a real address that answers for itself, and a node port is the node's own
// address.
func Escaped(snap *model.Snapshot) []Flow {
	if snap == nil {
		return nil
	}
	var flows []Flow
	for _, sp := range snap.Services {
		for _, ip := range sp.ClusterIPs {
			flows = append(flows, notDNATedTo(sp, ip))
		}
	}
	slices.SortFunc(flows, Flow.compare)
	return slices.Compact(flows)
}
