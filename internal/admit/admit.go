// Package admit decides, for the table of one address family, which service ports are
// programmed and with which frontends: the Services the limits set aside (a limit of
// their own, or the table's element budget shared fairly between namespaces: budget.go),
// the frontend address and node port each port wins when several claim one, and the
// external and load-balancer IPs refused to a port (claims.go), with the problems to
// report for all of them. Its decisions are data the compiler consumes: a Decisions per
// call.
//
// An Admission is incremental, as the compiler it serves: it keeps the previous call's
// service ports, claims and counts, and follows the changes between calls (a sync that
// adds one Service costs that Service's claims and cost, not a walk over every Service),
// deciding what a fresh Admission would decide for the same inputs.
package admit

import (
	"bytes"
	"net/netip"
	"slices"

	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/nft"
)

// Policy is what the configuration says about admission.
type Policy struct {
	// NoExternalIPs is the feature gate AllowServiceExternalIPs=false: no externalIP is
	// programmed at all (load-balancer IPs still are), as kube-proxy.
	NoExternalIPs bool
	// ServedPorts are the TCP ports nftproxy itself serves on this node (the health and
	// metrics servers): an externalIP or load-balancer IP that is one of the node's own
	// addresses never takes them.
	ServedPorts []uint16
	// OwnAddrs are addresses of this node besides Node.IPs and the node port addresses
	// that ServedPorts are protected on (the servers' bind addresses).
	OwnAddrs []netip.Addr
	// ClusterCIDRs are the pods' ranges (--cluster-cidr, whatever --detect-local-mode
	// is): no externalIP or load-balancer IP in them is programmed, nor in the node's
	// podCIDRs.
	ClusterCIDRs []netip.Prefix
	// ExternalIPCIDRs, when not empty, are the only ranges externalIPs are programmed
	// in (--external-ip-cidrs); load-balancer IPs are not affected.
	ExternalIPCIDRs []netip.Prefix
	// Limits bound what one Service, and the whole table, may cost.
	Limits Limits
}

// Admission decides for the snapshots of one family, one call after another. It must be
// used by one goroutine at a time.
type Admission struct {
	v6     bool
	policy Policy
	// cost is the estimated element cost of a service port (the budget's currency)
	cost func(*model.ServicePort) int
	// fixedAddrs are node port addresses of the configuration, besides the snapshot's
	fixedAddrs []netip.Addr

	// of the previous call: its service ports (snapshots are immutable) and their states
	services []*model.ServicePort
	state    []uint8
	spare    []uint8 // an array for the next call's states
	// what decides every claim: made anew when the node, its addresses, the service
	// CIDRs or the Services set aside change
	node          model.Node
	nodePortAddrs []netip.Addr // the snapshot's
	serviceCIDRs  []netip.Prefix
	aside         []serviceName // sorted
	claims        *claimTable   // nil before the first call
	renewed       bool          // the previous call made claims anew
	budget        budget

	// every service's cluster IPs (all families), each with the number of service ports
	// holding it, kept up to date from the difference between calls
	clusterIPs map[netip.Addr]int
	// endpointAddrs counts the endpoints' addresses of services, in buckets: when an
	// address becomes or stops being a cluster IP, the services with an endpoint there
	// are compiled again, and a bucket at zero says no service has one, without a look
	// at the 300,000 endpoints of 30,000 services (4 MB of buckets there)
	endpointAddrs addrCounts

	// this call's: the node's addresses that nftproxy knows (the snapshot's and the
	// fixed node port addresses), and the problems found
	ownAddrs []netip.Addr
	problems []model.Problem
	// per-call buffers, reused: the changes, and the claimed addresses (claimsOf)
	changes            []portChange
	internal, external []netip.Addr
}

// New returns an Admission for family: policy from the configuration, cost the element
// cost of a service port in the table (what the budget counts), nodePortAddrs the
// configuration's fixed node port addresses (the snapshot brings the others).
func New(family nft.Family, policy Policy, cost func(*model.ServicePort) int, nodePortAddrs []netip.Addr) *Admission {
	v6 := family == nft.IPv6
	return &Admission{v6: v6, policy: policy, cost: cost, fixedAddrs: nodePortAddrs, endpointAddrs: addrCounts{v6: v6}}
}

// Decisions is what one call decided. It refers to the Admission's tables: it holds
// until the next call.
type Decisions struct {
	// Renewed is set when every claim was decided anew (the first call, or a change of
	// the node, its addresses, the service CIDRs or the Services set aside): no claim of
	// the previous call holds.
	Renewed bool
	// Affected are the service ports whose claims may differ from the previous call's
	// (the first holder of one of their frontends or node port changed), when not
	// Renewed.
	Affected map[*model.ServicePort]bool
	// Moved are the addresses that became or stopped being a cluster IP where an
	// endpoint may be (nil: none); an endpoint at a cluster IP is not programmed.
	Moved map[netip.Addr]bool
	// Changes is the number of service ports that came, went or were replaced.
	Changes int
	// Problems are the Services set aside (each reported by the family of its first
	// cluster IP), the refused addresses and the lost claims.
	Problems []model.Problem
	// SetAside is the number of Services the limits left out.
	SetAside int

	a *Admission
}

// Programmed reports whether the snapshot's service port i is programmed in the family:
// it has a cluster IP in it and is not set aside.
func (d Decisions) Programmed(i int) bool { return d.a.state[i] == stateHas }

// Claims returns the frontends and node port that sp (a programmed service port) holds.
// Its addresses are in per-call buffers: Clone keeps them.
func (d Decisions) Claims(sp *model.ServicePort) Claims { return d.a.claims.claimsOf(d.a, sp) }

// ClusterIP reports whether addr is a cluster IP of any service (any family).
func (d Decisions) ClusterIP(addr netip.Addr) bool { return d.a.clusterIPs[addr] > 0 }

// Claims are the frontends and node port a service port won.
type Claims struct {
	Internal []netip.Addr // cluster IPs
	External []netip.Addr // external and load-balancer IPs
	NodePort uint16       // 0: none
}

// Clone copies the claims out of the per-call buffers.
func (c Claims) Clone() Claims {
	return Claims{Internal: slices.Clip(slices.Clone(c.Internal)), External: slices.Clip(slices.Clone(c.External)), NodePort: c.NodePort}
}

// Equal reports whether c and o claim the same.
func (c Claims) Equal(o Claims) bool {
	return slices.Equal(c.Internal, o.Internal) && slices.Equal(c.External, o.External) && c.NodePort == o.NodePort
}

const (
	stateHas   uint8 = 1 << iota // has a cluster IP in this family
	stateAside                   // set aside by a limit
)

// portChange is a service port that came, went or was replaced since the previous
// call: old is the previous call's (nil: it came) with its state then, new this call's
// (nil: it went) at services[at].
type portChange struct {
	old, new *model.ServicePort
	oldState uint8
	at       int
}

// Admit decides for snap's service ports.
func (a *Admission) Admit(snap *model.Snapshot) Decisions {
	renew := a.claims == nil || !a.node.Equal(snap.Node) || !slices.Equal(a.nodePortAddrs, snap.NodePortAddrs)
	a.node, a.nodePortAddrs = snap.Node, snap.NodePortAddrs
	a.ownAddrs = a.fixedAddrs
	for _, addr := range snap.NodePortAddrs {
		if !slices.Contains(a.ownAddrs, addr) {
			a.ownAddrs = append(slices.Clip(a.ownAddrs), addr)
		}
	}
	a.problems = nil
	services := snap.Services
	state := grow(a.spare, len(services))
	changes := a.diff(services, state)
	moved := a.trackAddrs(changes, services)
	aside := a.setAside(services, changes, state)

	// the claims: the table follows the changes, unless what decides them all changed
	renew = renew || !slices.Equal(a.serviceCIDRs, snap.ServiceCIDRs) || !slices.Equal(a.aside, aside)
	a.serviceCIDRs = snap.ServiceCIDRs
	switch {
	case renew:
		a.claims = newClaimTable(bytes.Count(state, []byte{stateHas})) // its claimants
		a.internal, a.external = make([]netip.Addr, 0, len(services)), nil
		a.claims.fill(a, services, state, &a.endpointAddrs)
		a.aside = aside
	case a.renewed:
		// the claimed addresses of every service port: not worth keeping their room for
		// the few a later call claims again (parts hold copies)
		a.internal, a.external = nil, nil
		fallthrough
	default:
		a.internal, a.external = a.internal[:0], a.external[:0]
		a.claims.update(a, changes, state, moved, services, &a.endpointAddrs)
	}
	a.renewed = renew
	a.problems = append(a.problems, a.claims.problems(a)...)

	// endpoints at an address that became or stopped being a cluster IP are compiled again
	if !a.endpointAddrs.anyOf(moved) {
		moved = nil // no endpoint is at an address that moved: none to look for
	}
	d := Decisions{Renewed: renew, Affected: a.claims.affected, Moved: moved, Changes: len(changes), Problems: a.problems, SetAside: len(aside), a: a}
	a.services, a.state, a.spare = services, state, a.state
	clear(changes) // no old port kept alive
	if cap(changes) > 1024 {
		a.changes = nil // the first call's, or a large change's: a megabyte at 30k
	}
	return d
}

// grow returns s[:n], cleared, reusing its array when large enough.
func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		// room for more: services come one by one, and an exact size would make every
		// sync that adds one allocate again
		return make([]T, n, n+n/8+16)
	}
	s = s[:n]
	clear(s)
	return s
}

// diff walks the previous call's service ports and services in step (both in name
// order) and returns the ports that came, went or were replaced, in name order; a
// replaced port (same name, another pointer) is one change. It sets each port's
// stateHas (a cluster IP in the family) in state: an unchanged port (the previous
// call's pointer) keeps its previous one, for the cost of a pointer comparison.
func (a *Admission) diff(services []*model.ServicePort, state []uint8) []portChange {
	v6 := a.v6
	old, oldState := a.services, a.state
	changes := a.changes[:0]
	if len(old) == 0 {
		changes = make([]portChange, 0, len(services)) // the first call: all of them
	}
	j := 0
	for i, sp := range services {
		for ; j < len(old) && old[j] != sp && old[j].Name.Less(sp.Name); j++ {
			changes = append(changes, portChange{old: old[j], oldState: oldState[j], at: -1})
		}
		if j < len(old) && old[j] == sp { // unchanged: no name to compare
			state[i] = oldState[j] & stateHas
			j++
			continue
		}
		ch := portChange{new: sp, at: i}
		if j < len(old) && old[j].Name == sp.Name {
			ch.old, ch.oldState = old[j], oldState[j]
			j++
		}
		if slices.ContainsFunc(sp.ClusterIPs, func(ip netip.Addr) bool { return ip.Is6() == v6 }) {
			state[i] = stateHas
		}
		changes = append(changes, ch)
	}
	for ; j < len(old); j++ {
		changes = append(changes, portChange{old: old[j], oldState: oldState[j], at: -1})
	}
	a.changes = changes
	return changes
}

// trackAddrs brings the cluster IP counts and the endpoint-address counts up to date
// with the changes since the previous call and returns the addresses that became or
// stopped being a cluster IP. A replaced port whose cluster IPs or endpoints are the
// same slices (the model reuses an unchanged service's) costs a slice comparison.
func (a *Admission) trackAddrs(changes []portChange, services []*model.ServicePort) map[netip.Addr]bool {
	if a.clusterIPs == nil {
		a.clusterIPs = make(map[netip.Addr]int, len(services))
	}
	var moved map[netip.Addr]bool
	change := func(ips []netip.Addr, d int) {
		for _, ip := range ips {
			n := a.clusterIPs[ip] + d
			if n <= 0 {
				delete(a.clusterIPs, ip)
			} else {
				a.clusterIPs[ip] = n
			}
			if (n == 0 && d < 0) || (n == 1 && d > 0) {
				if moved == nil {
					moved = map[netip.Addr]bool{}
				}
				moved[ip] = true
			}
		}
	}
	eps := &a.endpointAddrs
	for _, ch := range changes {
		switch {
		case ch.old != nil && ch.new != nil:
			if !same(ch.old.ClusterIPs, ch.new.ClusterIPs) && !slices.Equal(ch.old.ClusterIPs, ch.new.ClusterIPs) {
				change(ch.old.ClusterIPs, -1)
				change(ch.new.ClusterIPs, +1)
			}
			if !same(ch.old.Endpoints, ch.new.Endpoints) {
				eps.add(ch.old.Endpoints, -1)
				eps.add(ch.new.Endpoints, +1)
			}
		case ch.old != nil:
			change(ch.old.ClusterIPs, -1)
			eps.add(ch.old.Endpoints, -1)
		default:
			change(ch.new.ClusterIPs, +1)
			eps.add(ch.new.Endpoints, +1)
		}
	}
	eps.resize(services)
	return moved
}

// same reports whether a and b are the same slice (equal without a look at the elements).
func same[T any](a, b []T) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}
