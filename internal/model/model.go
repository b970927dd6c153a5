// Package model is the proxy's view of the cluster as plain, immutable data: one entry
// per service port, with its frontends (cluster IPs, node port, external and load-balancer
// IPs) and every endpoint with its conditions. It knows nothing of nftables. Build turns
// Kubernetes objects into a Snapshot; Categorize picks the endpoints a packet may use.
package model

import (
	"fmt"
	"net/netip"
	"slices"
	"time"
)

// Protocol numbers (IANA) for the transport protocols a Service may use.
const (
	ProtoTCP  uint8 = 6
	ProtoUDP  uint8 = 17
	ProtoSCTP uint8 = 132
)

// ProtoString is the Kubernetes spelling of a protocol number.
func ProtoString(p uint8) string {
	switch p {
	case ProtoTCP:
		return "TCP"
	case ProtoUDP:
		return "UDP"
	case ProtoSCTP:
		return "SCTP"
	}
	return fmt.Sprintf("proto-%d", p)
}

// ServicePortName identifies one port of one service.
type ServicePortName struct {
	Namespace string
	Name      string
	Port      string // the port's name; "" for a single unnamed port
	Protocol  uint8
}

// String is "namespace/name:port", or "namespace/name" for an unnamed port: the form used
// in logs, rule comments and metrics.
func (n ServicePortName) String() string {
	if n.Port == "" {
		return n.Namespace + "/" + n.Name
	}
	return n.Namespace + "/" + n.Name + ":" + n.Port
}

// Compare orders service port names like Less: -1, 0 or +1.
func (n ServicePortName) Compare(o ServicePortName) int {
	switch {
	case n.Less(o):
		return -1
	case o.Less(n):
		return 1
	}
	return 0
}

// Less orders service ports by namespace, name, port name, protocol.
func (n ServicePortName) Less(o ServicePortName) bool {
	if n.Namespace != o.Namespace {
		return n.Namespace < o.Namespace
	}
	if n.Name != o.Name {
		return n.Name < o.Name
	}
	if n.Port != o.Port {
		return n.Port < o.Port
	}
	return n.Protocol < o.Protocol
}

// ServicePort is one port of a proxied service with everything needed to program it.
type ServicePort struct {
	Name ServicePortName
	// ClusterIPs holds at most one address per family.
	ClusterIPs      []netip.Addr
	Port            uint16
	NodePort        uint16 // 0: none
	ExternalIPs     []netip.Addr
	LoadBalancerIPs []netip.Addr // ingress IPs with ipMode VIP (Proxy-mode IPs are left out)
	// Endpoints are all endpoints of the service's slices for this port, deduplicated,
	// with their conditions; Categorize selects the usable ones.
	Endpoints []Endpoint

	// ExternalPolicyLocal: externalTrafficPolicy Local on an externally accessible
	// service (node port, external or load-balancer IPs).
	ExternalPolicyLocal bool
	// InternalPolicyLocal: internalTrafficPolicy Local.
	InternalPolicyLocal bool
	// HealthCheckNodePort serves the local endpoint count for externalTrafficPolicy
	// Local load balancers; 0: none.
	HealthCheckNodePort uint16
	// AffinityTimeout is the ClientIP session affinity timeout in seconds; 0: no
	// affinity.
	AffinityTimeout uint32
	// Balancing is how a new flow's endpoint is chosen, from the Service's
	// LoadBalancingAnnotation; BalancingDefault: the proxy's configured default.
	Balancing Balancing
	// SourceRanges (loadBalancerSourceRanges) restrict who may use the load-balancer
	// IPs; empty: everyone.
	SourceRanges []netip.Prefix
	// SourceRangesBroken: some loadBalancerSourceRanges entry could not be parsed. A
	// family with no usable range is then closed (its load-balancer IPs drop
	// everything) rather than open to everyone.
	SourceRangesBroken bool
	// Created is the Service's creationTimestamp: of two services claiming one external
	// or load-balancer address, the older keeps it (the same answer on every node).
	Created time.Time
}

// ExternallyAccessible reports whether the service port has external frontends.
func (sp *ServicePort) ExternallyAccessible() bool {
	return sp.NodePort != 0 || len(sp.ExternalIPs) > 0 || len(sp.LoadBalancerIPs) > 0
}

// Endpoint is one backend address and port with its conditions.
type Endpoint struct {
	Addr        netip.Addr
	Port        uint16
	Ready       bool
	Serving     bool
	Terminating bool
	NodeName    string
	Zone        string
	// Hints are the endpoint's topology hints; nil when it has none (most endpoints:
	// a pointer keeps 40 bytes of empty lists out of each of hundreds of thousands).
	Hints *Hints
}

// Hints are an endpoint's topology hints.
type Hints struct {
	Zones []string // hints.forZones
	Nodes []string // hints.forNodes
}

// ZoneHints returns the zones the endpoint is hinted for.
func (e *Endpoint) ZoneHints() []string {
	if e.Hints == nil {
		return nil
	}
	return e.Hints.Zones
}

// NodeHints returns the nodes the endpoint is hinted for.
func (e *Endpoint) NodeHints() []string {
	if e.Hints == nil {
		return nil
	}
	return e.Hints.Nodes
}

// AddrPort returns the endpoint as an address and port.
func (e Endpoint) AddrPort() netip.AddrPort { return netip.AddrPortFrom(e.Addr, e.Port) }

// Node is what the proxy needs to know about the node it runs on.
type Node struct {
	Name string
	// IPs are the node's primary addresses, at most one per family, InternalIP first.
	IPs  []netip.Addr
	Zone string
	// PodCIDRs are the node's spec.podCIDRs, at most one per family (for
	// --detect-local-mode=NodeCIDR).
	PodCIDRs []netip.Prefix
}

// Equal reports whether n and o are the same node with the same addresses, zone and pod
// CIDRs.
func (n Node) Equal(o Node) bool {
	return n.Name == o.Name && n.Zone == o.Zone && slices.Equal(n.IPs, o.IPs) && slices.Equal(n.PodCIDRs, o.PodCIDRs)
}

// Snapshot is the complete input of one sync: everything the compiler needs is in it
// when BuildFrom (or Cache.BuildFrom) returns it, and nothing writes it afterwards.
type Snapshot struct {
	Node Node
	// Services are sorted by Name. They are shared: a snapshot and the next one hold
	// the same *ServicePort for a service that did not change, so building one copies
	// pointers, not service ports (nothing modifies a ServicePort once built).
	Services []*ServicePort
	// ServiceCIDRs are the ranges cluster IPs are allocated from (ServiceCIDR objects or
	// --service-cluster-ip-range); traffic to an unallocated address in them is dropped.
	ServiceCIDRs []netip.Prefix
	// NodePortAddrs are the local addresses node ports answer on (--nodeport-addresses
	// resolved when the snapshot was built).
	NodePortAddrs []netip.Addr
	// Changes says which service ports may differ from the previous snapshot of the
	// same Cache.
	Changes Changes
}

// Problem is an object (or part of one) that could not be used, with the reason. Each is
// logged once and reported as an event on the object where it fits; the rest of the
// object and all other objects are still programmed.
type Problem struct {
	Kind      ObjectKind
	Namespace string
	Name      string
	Reason    string
}

// ObjectKind is the kind of API object a Problem is about.
type ObjectKind string

const (
	KindService       ObjectKind = "Service"
	KindEndpointSlice ObjectKind = "EndpointSlice"
)

func (k ObjectKind) String() string { return string(k) }

func (p Problem) String() string {
	return fmt.Sprintf("%s %s/%s: %s", p.Kind, p.Namespace, p.Name, p.Reason)
}

// The endpoint conditions are read here and nowhere else: UsableEndpoints (new
// connections: the ruleset through Categorize, conntrack's default) and
// ServingEndpoints (established UDP flows the proxy keeps).

// UsableEndpoints returns the endpoints among eps that keep accepts (nil: all) which new
// connections may use: the ready ones or, when none is ready, the ones still serving
// while terminating (graceful termination). Endpoints that are not serving are never
// used. When every endpoint qualifies, eps itself is returned.
func UsableEndpoints(eps []Endpoint, keep func(Endpoint) bool) []Endpoint {
	if out := filter(eps, func(e Endpoint) bool { return e.Ready && (keep == nil || keep(e)) }); len(out) > 0 {
		return out
	}
	if out := filter(eps, func(e Endpoint) bool { return e.usableTerminating() && (keep == nil || keep(e)) }); len(out) > 0 {
		return out
	}
	return nil
}

// usableTerminating: an endpoint new connections may use when none is ready.
func (e Endpoint) usableTerminating() bool { return e.Serving && e.Terminating }

// usable: an endpoint new connections may use, at least while none is ready.
func (e Endpoint) usable() bool { return e.Ready || e.usableTerminating() }

// ServingEndpoints returns the endpoints whose established flows are kept: every ready or
// serving one. It is wider than UsableEndpoints: like kube-proxy, a terminating endpoint
// that still serves drains its clients instead of having them cut, even while other
// endpoints are ready.
func ServingEndpoints(eps []Endpoint) []Endpoint {
	return filter(eps, func(e Endpoint) bool { return e.Serving || e.Ready })
}

// SpecialAddr says why addr can never be a service frontend or an endpoint: loopback,
// link-local (169.254.0.0/16, fe80::/10), unspecified, multicast or the IPv4 broadcast
// address. "" for an ordinary address. (The API refuses such endpoints and externalIPs
// today; objects stored before it did still carry them.)
func SpecialAddr(addr netip.Addr) string {
	addr = addr.Unmap()
	switch {
	case addr.IsLoopback():
		return "a loopback address"
	case addr.IsLinkLocalUnicast():
		return "a link-local address"
	case addr.IsUnspecified():
		return "the unspecified address"
	case addr.IsMulticast():
		return "a multicast address"
	case addr == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "the broadcast address"
	}
	return ""
}

// AddrsOf returns the addresses of family v6 (true) or v4 (false).
func AddrsOf(addrs []netip.Addr, v6 bool) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		if a.Is6() == v6 {
			out = append(out, a)
		}
	}
	return out
}

// Equal reports whether two service ports are the same in every field. Snapshots are
// never modified once built, so caches may keep shallow copies and compare them.
func (sp *ServicePort) Equal(o *ServicePort) bool {
	return sp.Name == o.Name && sp.Port == o.Port && sp.NodePort == o.NodePort &&
		sp.ExternalPolicyLocal == o.ExternalPolicyLocal && sp.InternalPolicyLocal == o.InternalPolicyLocal &&
		sp.HealthCheckNodePort == o.HealthCheckNodePort && sp.AffinityTimeout == o.AffinityTimeout &&
		slices.Equal(sp.ClusterIPs, o.ClusterIPs) && slices.Equal(sp.ExternalIPs, o.ExternalIPs) &&
		slices.Equal(sp.LoadBalancerIPs, o.LoadBalancerIPs) && slices.Equal(sp.SourceRanges, o.SourceRanges) &&
		sp.SourceRangesBroken == o.SourceRangesBroken && sp.Created.Equal(o.Created) &&
		(same(sp.Endpoints, o.Endpoints) || slices.EqualFunc(sp.Endpoints, o.Endpoints, Endpoint.Equal))
}

// same reports whether a and b are the same slice (same array, same length): equal
// without looking at the elements.
func same[T any](a, b []T) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// Equal reports whether two endpoints are the same in every field.
func (e Endpoint) Equal(o Endpoint) bool {
	return e.Addr == o.Addr && e.Port == o.Port && e.Ready == o.Ready && e.Serving == o.Serving &&
		e.Terminating == o.Terminating && e.NodeName == o.NodeName && e.Zone == o.Zone &&
		slices.Equal(e.ZoneHints(), o.ZoneHints()) && slices.Equal(e.NodeHints(), o.NodeHints())
}

// Ports returns pointers to copies of ports, in their order: a Snapshot's Services
// from service port values (tests and tools build snapshots by hand).
func Ports(ports []ServicePort) []*ServicePort {
	return appendPointers(make([]*ServicePort, 0, len(ports)), slices.Clone(ports))
}

// LoadBalancingAnnotation chooses, per Service, how nftproxy picks a new flow's
// endpoint: "random" (kube-proxy's uniform random choice) or "maglev" (consistent
// hashing of the client's address and port through a Maglev lookup table). Without it
// the proxy's default applies (--load-balancing).
const LoadBalancingAnnotation = "nftproxy.io/load-balancing"

// Balancing is how a service port picks a new flow's endpoint.
type Balancing uint8

// Balancings.
const (
	BalancingDefault Balancing = iota // the proxy's default
	BalancingRandom                   // uniform random choice (kube-proxy)
	BalancingMaglev                   // consistent hashing of saddr . sport, Maglev table
)

// ParseBalancing reads a LoadBalancingAnnotation or --load-balancing value.
func ParseBalancing(s string) (Balancing, bool) {
	switch s {
	case "random":
		return BalancingRandom, true
	case "maglev":
		return BalancingMaglev, true
	}
	return BalancingDefault, false
}

func (b Balancing) String() string {
	switch b {
	case BalancingRandom:
		return "random"
	case BalancingMaglev:
		return "maglev"
	}
	return "default"
}
