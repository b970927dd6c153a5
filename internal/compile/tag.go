package compile

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

// PurposeOf returns the purpose a part, rule or element was tagged with; PurposeNone if
// it has no tag of the compiler's.
func PurposeOf(t nft.Tag) Purpose {
	if ct, ok := TagOf(t); ok {
		return ct.Purpose
	}
	return PurposeNone
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
	PurposeNone Purpose = iota
	// PurposeServicePort tags a service port's part as a whole.
	PurposeServicePort

	// Frontends (elements of the shared sets and maps, and the rules that read them).

	// PurposeClusterIP: an element of the cluster IP set.
	PurposeClusterIP
	// PurposeDispatch: a frontend's entry in service-ips / service-nodeports (→ the
	// service port's chain), and the rules that look them up.
	PurposeDispatch
	// PurposeRejectNoEndpoints: a frontend of a service port without endpoints (→ the
	// reject chain), the rules that look them up, and the reject chain's rule.
	PurposeRejectNoEndpoints
	// PurposeDropNoLocalEndpoints: a frontend whose traffic policy is Local with no
	// endpoint on this node (→ drop).
	PurposeDropNoLocalEndpoints
	// PurposeCount: a counter element of a frontend, and the rules that count.
	PurposeCount
	// PurposeSourceRanges: a load-balancer IP's entry in firewall-ips (→ its source
	// range chain), and the rule that looks it up.
	PurposeSourceRanges
	// PurposeSourceRangeAllow: a source range chain's rule admitting a range.
	PurposeSourceRangeAllow
	// PurposeSourceRangeDrop: a source range chain's last rule, dropping the rest.
	PurposeSourceRangeDrop
	// PurposeFrontend: a frontend's element in cluster-frontends, external-frontends or
	// nodeport-frontends (the flat path), and the rules that look them up.
	PurposeFrontend
	// PurposeEndpointCount: a frontend's element in an endpoint-count-bit set, and the
	// tree rules that read them.
	PurposeEndpointCount

	// A service port's chains.

	// PurposeMarkOffCluster: marks traffic to a cluster IP from outside the cluster CIDR
	// for masquerade.
	PurposeMarkOffCluster
	// PurposeMarkAll: marks all traffic to a cluster IP for masquerade
	// (--masquerade-all).
	PurposeMarkAll
	// PurposeMarkExternal: marks external traffic (Cluster policy) for masquerade.
	PurposeMarkExternal
	// PurposeMarkLocalSource: marks external traffic sent by the node itself (Local
	// policy) for masquerade.
	PurposeMarkLocalSource
	// PurposeShortCircuitPods: external traffic from pods goes to every endpoint
	// (Local policy).
	PurposeShortCircuitPods
	// PurposeShortCircuitLocal: external traffic from the node goes to every endpoint
	// (Local policy).
	PurposeShortCircuitLocal
	// PurposeToEndpoints: external traffic goes to the chain that picks an endpoint.
	PurposeToEndpoints
	// PurposeEndpointDNAT: the rule that translates to an endpoint.
	PurposeEndpointDNAT
	// PurposeEndpointSlot: an element of an endpoint slot map.
	PurposeEndpointSlot
	// PurposeHairpin: an element of the hairpin set, and the rule masquerading
	// hairpin traffic.
	PurposeHairpin
	// PurposeAffinityLookup: a client seen recently goes back to its endpoint.
	PurposeAffinityLookup
	// PurposeAffinityPick: a new client draws an endpoint.
	PurposeAffinityPick
	// PurposeAffinityRecord: an endpoint's chain records the client.
	PurposeAffinityRecord

	// The table's own rules.

	// PurposeMasquerade: the masquerading chain's rules for marked packets.
	PurposeMasquerade
	// PurposeMarkBit: the chain that sets the masquerade mark.
	PurposeMarkBit
	// PurposeUndefinedPort: rejects a cluster IP port that no service defines.
	PurposeUndefinedPort
	// PurposeUnallocatedServiceIP: drops traffic to an unallocated service IP.
	PurposeUnallocatedServiceIP
	// PurposeHook: a base chain's rule jumping to a regular chain.
	PurposeHook
	// PurposeNoMasquerade: a masquerading chain's rule letting traffic to one of
	// --no-masquerade-cidrs keep its source address.
	PurposeNoMasquerade
	// PurposeFastPath: the rule adding established service flows to the fast path's
	// flowtable (--fast-path-interfaces).
	PurposeFastPath

	numPurposes
)

var purposeNames = [numPurposes]string{
	PurposeNone: "none", PurposeServicePort: "service port",
	PurposeClusterIP: "cluster IP", PurposeDispatch: "dispatch",
	PurposeRejectNoEndpoints: "reject: no endpoints", PurposeDropNoLocalEndpoints: "drop: no local endpoints",
	PurposeCount: "count", PurposeSourceRanges: "source ranges",
	PurposeSourceRangeAllow: "source range: allow", PurposeSourceRangeDrop: "source range: drop",
	PurposeFrontend: "frontend", PurposeEndpointCount: "endpoint count",
	PurposeMarkOffCluster: "masquerade mark: off-cluster source", PurposeMarkAll: "masquerade mark: --masquerade-all",
	PurposeMarkExternal: "masquerade mark: external traffic", PurposeMarkLocalSource: "masquerade mark: node source",
	PurposeShortCircuitPods: "short-circuit: pods", PurposeShortCircuitLocal: "short-circuit: node",
	PurposeToEndpoints: "to endpoints", PurposeEndpointDNAT: "endpoint DNAT", PurposeEndpointSlot: "endpoint slot",
	PurposeHairpin: "hairpin", PurposeAffinityLookup: "affinity: known client",
	PurposeAffinityPick: "affinity: new client", PurposeAffinityRecord: "affinity: record client",
	PurposeMasquerade: "masquerade", PurposeMarkBit: "masquerade mark",
	PurposeUndefinedPort: "undefined cluster IP port", PurposeUnallocatedServiceIP: "unallocated service IP",
	PurposeHook: "hook", PurposeNoMasquerade: "no masquerade", PurposeFastPath: "fast path",
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

// own returns the tag of the table's own rules and elements with purpose p.
func own(p Purpose) *Tag { return tableTags[p] }

// tag returns the part's tag for purpose p, made once per part and shared by its rules
// and elements. Tags are made in blocks: one allocation serves a typical part.
func (cp *compiledPart) tag(p Purpose) *Tag {
	for _, t := range cp.tags {
		if t.Purpose == p {
			return t
		}
	}
	if len(cp.tagBlock) == cap(cp.tagBlock) {
		cp.tagBlock = make([]Tag, 0, 8) // tags already handed out keep the old block alive
	}
	cp.tagBlock = append(cp.tagBlock, Tag{Port: &cp.in.Name, Purpose: p})
	t := &cp.tagBlock[len(cp.tagBlock)-1]
	cp.tags = append(cp.tags, t)
	return t
}
