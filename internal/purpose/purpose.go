// Package purpose is what the compiler says each part, rule and set element of a ruleset
// is for: a Tag with the service port it serves and its Purpose. Readers of a ruleset
// (the controller's isolation, the per-service counters, explain) switch on these types
// and never parse chain names or comments.
package purpose

import (
	"strconv"

	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/nft"
)

// Tag is what the compiler says a part, rule or set element of its ruleset is for: the
// service port it serves (the zero name for the table's own rules) and its purpose. It is
// the nft.Tag of everything Compile produces, so that readers of a ruleset (the
// controller's isolation, the per-service counters, explain) switch on these types and
// never parse chain names or comments; the comments stay for humans reading "nft list".
// Tags are never modified once made. Port points at the name in the service port the
// part was compiled from (nil for the table's own objects): a part has up to a dozen
// tags, and a copy of the name in each took 15 MB at 30,000 service ports.
type Tag struct {
	Port    *model.ServicePortName
	Purpose Purpose
}

// String is "<service port> <purpose>", or the purpose alone for the table's own rules.
func (t *Tag) String() string {
	if t.Port == nil {
		return t.Purpose.String()
	}
	return t.Port.String() + " " + t.Purpose.String()
}

// TagOf returns the compiler's tag of a part, rule or element; false if it has none.
func TagOf(t nft.Tag) (*Tag, bool) {
	ct, ok := t.(*Tag)
	return ct, ok && ct != nil
}

// Of returns the purpose a part, rule or element was tagged with; None if
// it has no tag of the compiler's.
func Of(t nft.Tag) Purpose {
	if ct, ok := TagOf(t); ok {
		return ct.Purpose
	}
	return None
}

// ServicePortOf returns the service port a part, rule or element serves; false for the
// table's own objects and untagged ones.
func ServicePortOf(t nft.Tag) (model.ServicePortName, bool) {
	ct, ok := TagOf(t)
	if !ok || ct.Port == nil {
		return model.ServicePortName{}, false
	}
	return *ct.Port, true
}

// Purpose is why a rule or element is in the ruleset.
type Purpose uint8

// Purposes. The layout they belong to is in docs/architecture.md.
const (
	None Purpose = iota
	// ServicePort tags a service port's part as a whole.
	ServicePort

	// Frontends (elements of the shared sets and maps, and the rules that read them).

	// ClusterIP: an element of the cluster IP set.
	ClusterIP
	// Dispatch: a frontend's entry in service-ips / service-nodeports (→ the
	// service port's chain), and the rules that look them up.
	Dispatch
	// RejectNoEndpoints: a frontend of a service port without endpoints (→ the
	// reject chain), the rules that look them up, and the reject chain's rule.
	RejectNoEndpoints
	// DropNoLocalEndpoints: a frontend whose traffic policy is Local with no
	// endpoint on this node (→ drop).
	DropNoLocalEndpoints
	// Count: a counter element of a frontend, and the rules that count.
	Count
	// SourceRanges: a load-balancer IP's entry in firewall-ips (→ its source
	// range chain), and the rule that looks it up.
	SourceRanges
	// SourceRangeAllow: a source range chain's rule admitting a range.
	SourceRangeAllow
	// SourceRangeDrop: a source range chain's last rule, dropping the rest.
	SourceRangeDrop
	// Frontend: a frontend's element in cluster-frontends, external-frontends or
	// nodeport-frontends (the flat path), and the rules that look them up.
	Frontend
	// EndpointCount: a frontend's element in an endpoint-count-bit set, and the
	// tree rules that read them.
	EndpointCount

	// A service port's chains.

	// MarkOffCluster: marks traffic to a cluster IP from outside the cluster CIDR
	// for masquerade.
	MarkOffCluster
	// MarkAll: marks all traffic to a cluster IP for masquerade
	// (--masquerade-all).
	MarkAll
	// MarkExternal: marks external traffic (Cluster policy) for masquerade.
	MarkExternal
	// MarkLocalSource: marks external traffic sent by the node itself (Local
	// policy) for masquerade.
	MarkLocalSource
	// ShortCircuitPods: external traffic from pods goes to every endpoint
	// (Local policy).
	ShortCircuitPods
	// ShortCircuitLocal: external traffic from the node goes to every endpoint
	// (Local policy).
	ShortCircuitLocal
	// ToEndpoints: external traffic goes to the chain that picks an endpoint.
	ToEndpoints
	// EndpointDNAT: the rule that translates to an endpoint.
	EndpointDNAT
	// EndpointSlot: an element of an endpoint slot map.
	EndpointSlot
	// Hairpin: an element of the hairpin set, and the rule masquerading
	// hairpin traffic.
	Hairpin
	// AffinityLookup: a client seen recently goes back to its endpoint.
	AffinityLookup
	// AffinityPick: a new client draws an endpoint.
	AffinityPick
	// AffinityRecord: an endpoint's chain records the client.
	AffinityRecord

	// The table's own rules.

	// Masquerade: the masquerading chain's rules for marked packets.
	Masquerade
	// MarkBit: the chain that sets the masquerade mark.
	MarkBit
	// UndefinedPort: rejects a cluster IP port that no service defines.
	UndefinedPort
	// UnallocatedServiceIP: drops traffic to an unallocated service IP.
	UnallocatedServiceIP
	// Hook: a base chain's rule jumping to a regular chain.
	Hook
	// NoMasquerade: a masquerading chain's rule letting traffic to one of
	// --no-masquerade-cidrs keep its source address.
	NoMasquerade
	// FastPath: the rule adding established service flows to the fast path's
	// flowtable (--fast-path-interfaces).
	FastPath

	numPurposes
)

var purposeNames = [numPurposes]string{
	None: "none", ServicePort: "service port",
	ClusterIP: "cluster IP", Dispatch: "dispatch",
	RejectNoEndpoints: "reject: no endpoints", DropNoLocalEndpoints: "drop: no local endpoints",
	Count: "count", SourceRanges: "source ranges",
	SourceRangeAllow: "source range: allow", SourceRangeDrop: "source range: drop",
	Frontend: "frontend", EndpointCount: "endpoint count",
	MarkOffCluster: "masquerade mark: off-cluster source", MarkAll: "masquerade mark: --masquerade-all",
	MarkExternal: "masquerade mark: external traffic", MarkLocalSource: "masquerade mark: node source",
	ShortCircuitPods: "short-circuit: pods", ShortCircuitLocal: "short-circuit: node",
	ToEndpoints: "to endpoints", EndpointDNAT: "endpoint DNAT", EndpointSlot: "endpoint slot",
	Hairpin: "hairpin", AffinityLookup: "affinity: known client",
	AffinityPick: "affinity: new client", AffinityRecord: "affinity: record client",
	Masquerade: "masquerade", MarkBit: "masquerade mark",
	UndefinedPort: "undefined cluster IP port", UnallocatedServiceIP: "unallocated service IP",
	Hook: "hook", NoMasquerade: "no masquerade", FastPath: "fast path",
}

func (p Purpose) String() string {
	if p < numPurposes {
		return purposeNames[p]
	}
	return "purpose " + strconv.Itoa(int(p))
}

// tableTags are the tags of the table's own rules and elements, one per purpose.
var tableTags = func() (t [numPurposes]*Tag) {
	for p := range t {
		t[p] = &Tag{Purpose: Purpose(p)}
	}
	return t
}()

// Table returns the tag of the table's own rules and elements with purpose p (no
// service port), one for all of them.
func Table(p Purpose) *Tag { return tableTags[p] }
