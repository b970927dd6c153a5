package admit

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"github.com/nftproxy/nftproxy/internal/model"
)

// Who gets each frontend and node port. Cluster IPs are claimed by every service and
// always win; among service ports claiming one cluster IP, port and protocol, the first
// in name order holds it. External and load-balancer IPs and node ports go to the oldest
// Service claiming them (then by name): the same answer on every node, and a Service
// created later, in any namespace, can never take a frontend away. An external or
// load-balancer IP that is any service's cluster IP, lies in the service CIDRs, is a
// special address (loopback, link-local, …), or is the node's own address on a port
// nftproxy serves, is refused for that service alone.
//
// The answer is kept from call to call in a claimTable and updated with the service
// ports that came and went: a sync that adds one Service costs the claims of its ports,
// not a claim of each of 30,000 cluster IPs (that pass was a fifth of a sync at 30k).

// claimTable holds the claimants of every frontend and node port, in order of
// precedence: the first one holds it, the others lose it and are reported on every
// call. Service ports set aside by a limit or without a cluster IP in the family claim
// nothing. Claimants are the snapshots' service port pointers (immutable): a port is
// removed with the pointer it was added with.
type claimTable struct {
	cluster  claimMap[frontendKey] // cluster IPs: by name
	external claimMap[frontendKey] // external and load-balancer IPs: oldest first
	nodePort claimMap[nodePortKey] // oldest first
	// withExternal: the ports in the table with external or load-balancer IPs in the
	// family, whose refusals depend on which addresses are cluster IPs
	withExternal map[*model.ServicePort]struct{}
	refused      map[*model.ServicePort][]model.Problem
	// affected: ports whose claims may differ from the previous call's (the first
	// holder of one of their keys changed), filled by each update
	affected map[*model.ServicePort]bool

	// What else refusals depend on (see claimTable.refusal), kept from the changes:
	// nodePorts counts every service port's node port and health-check node port (a
	// health-check port as TCP), whatever its family or state; watch counts the
	// claimants of each external address, and occupants holds, for each watched
	// address, the endpoints of every service port there, by protocol, port and
	// namespace.
	nodePorts map[nodePortKey]int
	watch     map[netip.Addr]int
	occupants map[netip.Addr]map[occupant]int
	unwatched []netip.Addr // whose watch count fell to zero during an update
}

// occupant is an endpoint's protocol and port, and the service port it is an endpoint
// of, with its Service's creation time.
type occupant struct {
	proto   uint8
	port    uint16
	of      model.ServicePortName
	created int64 // UnixNano
}

func occupantOf(sp *model.ServicePort, e *model.Endpoint) occupant {
	return occupant{sp.Name.Protocol, e.Port, sp.Name, sp.Created.UnixNano()}
}

// before reports whether the occupant's Service is older than sp's (byAge's order).
func (o occupant) before(sp *model.ServicePort) bool {
	return cmp.Or(cmp.Compare(o.created, sp.Created.UnixNano()), o.of.Compare(sp.Name)) < 0
}

// newClaimTable returns an empty table for about n service ports.
func newClaimTable(n int) *claimTable {
	return &claimTable{
		cluster:      newClaimMap[frontendKey](byName, n), // nearly every port has a cluster IP
		external:     newClaimMap[frontendKey](byAge, 0),
		nodePort:     newClaimMap[nodePortKey](byAge, 0),
		withExternal: map[*model.ServicePort]struct{}{},
		refused:      map[*model.ServicePort][]model.Problem{},
		affected:     map[*model.ServicePort]bool{},
		nodePorts:    map[nodePortKey]int{},
		watch:        map[netip.Addr]int{},
		occupants:    map[netip.Addr]map[occupant]int{},
	}
}

func byName(a, b *model.ServicePort) int { return a.Name.Compare(b.Name) }

func byAge(a, b *model.ServicePort) int {
	return cmp.Or(a.Created.Compare(b.Created), a.Name.Compare(b.Name))
}

// claimMap is the claimants of one kind of key.
type claimMap[K comparable] struct {
	held      map[K]holders
	contested map[K]struct{} // keys with more than one claimant
	order     func(a, b *model.ServicePort) int
	// filling: add appends without ordering (see claimTable.fill): a tenant's thousands
	// of Services claiming one address would otherwise cost an insertion each into an
	// ever longer list
	filling bool
}

// holders are a key's claimants: first holds it, more (nearly always empty) lose it,
// in order of precedence.
type holders struct {
	first *model.ServicePort
	more  []*model.ServicePort
}

// newClaimMap returns an empty claimMap ordered by order, with room for n keys.
func newClaimMap[K comparable](order func(a, b *model.ServicePort) int, n int) claimMap[K] {
	return claimMap[K]{held: make(map[K]holders, n), contested: map[K]struct{}{}, order: order}
}

// find returns where sp is, or would go, in more (ordered), and whether it is there.
func (m *claimMap[K]) find(more []*model.ServicePort, sp *model.ServicePort) (int, bool) {
	// ports of equal precedence have one name: in one snapshot, one port
	i, found := slices.BinarySearchFunc(more, sp, m.order)
	return i, found && more[i] == sp
}

// add makes sp a claimant of k (once: a service port listing an address twice does not
// compete with itself) and marks the holder it displaces as affected.
func (m *claimMap[K]) add(k K, sp *model.ServicePort, affected map[*model.ServicePort]bool) {
	h, ok := m.held[k]
	if !ok {
		m.held[k] = holders{first: sp}
		return
	}
	if h.first == sp {
		return
	}
	if m.filling {
		h.more = append(h.more, sp)
	} else {
		switch i, found := m.find(h.more, sp); {
		case found:
			return
		case m.order(sp, h.first) < 0:
			affected[h.first] = true
			h.more = slices.Insert(h.more, 0, h.first)
			h.first = sp
		default:
			h.more = slices.Insert(h.more, i, sp)
		}
	}
	m.held[k] = h
	m.contested[k] = struct{}{}
}

// settle orders the claimants the adds of a fill appended, each once.
func (m *claimMap[K]) settle() {
	m.filling = false
	for k := range m.contested {
		h := m.held[k]
		all := append(h.more, h.first)
		slices.SortFunc(all, m.order)
		all = slices.Compact(all) // a port listing an address twice
		h.first, h.more = all[0], slices.Clip(all[1:])
		if len(h.more) == 0 {
			h.more = nil
			delete(m.contested, k)
		}
		m.held[k] = h
	}
}

// remove takes sp off k's claimants (if it is one) and marks the claimant that then
// holds k as affected.
func (m *claimMap[K]) remove(k K, sp *model.ServicePort, affected map[*model.ServicePort]bool) {
	h, ok := m.held[k]
	if !ok {
		return
	}
	switch i, found := m.find(h.more, sp); {
	case h.first == sp && len(h.more) == 0:
		delete(m.held, k)
		return
	case h.first == sp:
		h.first = h.more[0]
		h.more = slices.Delete(h.more, 0, 1)
		affected[h.first] = true
	case found:
		h.more = slices.Delete(h.more, i, i+1)
	default:
		return
	}
	if len(h.more) == 0 {
		h.more = nil
		delete(m.contested, k)
	}
	m.held[k] = h
}

// holds reports whether sp holds k.
func (m *claimMap[K]) holds(k K, sp *model.ServicePort) bool {
	return m.held[k].first == sp
}

// claimsExternal reports whether sp claims anything beyond its cluster IPs.
func (a *Admission) claimsExternal(sp *model.ServicePort) bool {
	return sp.NodePort != 0 || len(sp.LoadBalancerIPs) > 0 || (len(sp.ExternalIPs) > 0 && !a.policy.NoExternalIPs)
}

// externalAddrs calls f with each external and load-balancer IP of sp in the family,
// and what it is.
func (a *Admission) externalAddrs(sp *model.ServicePort, f func(what string, ip netip.Addr)) {
	for k, ips := range [2][]netip.Addr{sp.ExternalIPs, sp.LoadBalancerIPs} {
		if k == 0 && a.policy.NoExternalIPs {
			continue
		}
		what := [2]string{whatExternalIP, "load-balancer IP"}[k]
		for _, ip := range ips {
			if ip.Is6() == a.v6 {
				f(what, ip)
			}
		}
	}
}

// whatExternalIP is what externalAddrs calls an externalIP.
const whatExternalIP = "externalIP"

func frontendOf(sp *model.ServicePort, ip netip.Addr) frontendKey {
	return frontendKey{ip.As16(), sp.Name.Protocol, sp.Port}
}

// add enters sp's claims (sp has a cluster IP in the family and is not set aside).
func (t *claimTable) add(a *Admission, sp *model.ServicePort) {
	for _, ip := range sp.ClusterIPs {
		if ip.Is6() == a.v6 {
			t.cluster.add(frontendOf(sp, ip), sp, t.affected)
		}
	}
	if !a.claimsExternal(sp) {
		return
	}
	var refused []model.Problem
	external := false
	a.externalAddrs(sp, func(what string, ip netip.Addr) {
		external = true
		t.watch[ip]++
		if reason := t.refusal(a, sp, what, ip); reason != "" {
			refused = append(refused, model.Problem{Kind: model.KindService, Namespace: sp.Name.Namespace, Name: sp.Name.Name, Reason: reason})
			return
		}
		t.external.add(frontendOf(sp, ip), sp, t.affected)
	})
	if external {
		t.withExternal[sp] = struct{}{}
	}
	if refused != nil {
		t.refused[sp] = refused
	}
	if sp.NodePort != 0 {
		t.nodePort.add(nodePortKey{sp.Name.Protocol, sp.NodePort}, sp, t.affected)
	}
}

// remove takes sp's claims out, whether or not each was refused when it came in.
func (t *claimTable) remove(a *Admission, sp *model.ServicePort) {
	for _, ip := range sp.ClusterIPs {
		if ip.Is6() == a.v6 {
			t.cluster.remove(frontendOf(sp, ip), sp, t.affected)
		}
	}
	if !a.claimsExternal(sp) {
		return
	}
	a.externalAddrs(sp, func(_ string, ip netip.Addr) {
		t.external.remove(frontendOf(sp, ip), sp, t.affected)
		if t.watch[ip]--; t.watch[ip] <= 0 {
			t.unwatched = append(t.unwatched, ip)
		}
	})
	delete(t.withExternal, sp)
	delete(t.refused, sp)
	if sp.NodePort != 0 {
		t.nodePort.remove(nodePortKey{sp.Name.Protocol, sp.NodePort}, sp, t.affected)
	}
}

// fill enters the claims of every service port that claims (state is stateHas) into an
// empty table, ordering each contested key's claimants once at the end.
func (t *claimTable) fill(a *Admission, services []*model.ServicePort, state []uint8, eps *addrCounts) {
	t.cluster.filling, t.external.filling, t.nodePort.filling = true, true, true
	var addrs []netip.Addr
	for i, sp := range services {
		t.countNodePorts(sp, +1)
		if state[i] == stateHas && a.claimsExternal(sp) {
			a.externalAddrs(sp, func(_ string, ip netip.Addr) { addrs = append(addrs, ip) })
		}
	}
	t.look(a, addrs, services, eps)
	for i, sp := range services {
		if state[i] == stateHas {
			t.add(a, sp)
		}
	}
	t.cluster.settle()
	t.external.settle()
	t.nodePort.settle()
}

// update brings the table from the previous call's service ports to this call's:
// changes are the ports that came, went or were replaced (see Compiler.diff), state
// this call's states; a port whose external or load-balancer IP became or stopped
// being a cluster IP (moved) is entered again, since its refusals may differ. The
// ports whose claims may have changed are left in t.affected.
func (t *claimTable) update(a *Admission, changes []portChange, state []uint8, moved map[netip.Addr]bool, services []*model.ServicePort, eps *addrCounts) {
	clear(t.affected)
	for _, ch := range changes {
		if ch.old != nil && ch.oldState == stateHas {
			t.remove(a, ch.old)
		}
	}
	// what the refusals of ports staying in the table depend on: endpoints at their
	// addresses, node ports at their ports
	shifted, ports := t.follow(a, changes)
	var again []*model.ServicePort
	if len(moved)+len(shifted)+len(ports) > 0 {
		for sp := range t.withExternal {
			hit := ports[nodePortKey{sp.Name.Protocol, sp.Port}]
			a.externalAddrs(sp, func(_ string, ip netip.Addr) { hit = hit || moved[ip] || shifted[ip] })
			if hit {
				again = append(again, sp)
			}
		}
		for _, sp := range again {
			t.remove(a, sp)
		}
	}
	var addrs []netip.Addr
	for _, ch := range changes {
		if ch.new != nil && state[ch.at] == stateHas && a.claimsExternal(ch.new) {
			a.externalAddrs(ch.new, func(_ string, ip netip.Addr) { addrs = append(addrs, ip) })
		}
	}
	for _, sp := range again {
		a.externalAddrs(sp, func(_ string, ip netip.Addr) { addrs = append(addrs, ip) })
	}
	t.look(a, addrs, services, eps)
	for _, ch := range changes {
		if ch.new != nil && state[ch.at] == stateHas {
			t.add(a, ch.new)
		}
	}
	for _, sp := range again {
		t.add(a, sp)
		t.affected[sp] = true
	}
	for _, ip := range t.unwatched {
		if t.watch[ip] <= 0 {
			delete(t.watch, ip)
			delete(t.occupants, ip)
		}
	}
	t.unwatched = t.unwatched[:0]
}

// countNodePorts counts sp's node port and health-check node port d (+1 or -1) times,
// and returns the keys whose count went from zero to one or from one to zero.
func (t *claimTable) countNodePorts(sp *model.ServicePort, d int) (flipped []nodePortKey) {
	for _, k := range [2]nodePortKey{{sp.Name.Protocol, sp.NodePort}, {model.ProtoTCP, sp.HealthCheckNodePort}} {
		if k.port == 0 {
			continue
		}
		n := t.nodePorts[k] + d
		if n <= 0 {
			delete(t.nodePorts, k)
		} else {
			t.nodePorts[k] = n
		}
		if (d > 0 && n == 1) || (d < 0 && n == 0) {
			flipped = append(flipped, k)
		}
	}
	return flipped
}

// follow brings the node port counts and the watched addresses' occupants up to date
// with the changes (every service port that came, went or was replaced, in any state),
// and returns the watched addresses where a namespace's endpoints at some port came or
// went, and the node ports that came or went.
func (t *claimTable) follow(a *Admission, changes []portChange) (shifted map[netip.Addr]bool, ports map[nodePortKey]bool) {
	flip := func(ks []nodePortKey) {
		for _, k := range ks {
			if ports == nil {
				ports = map[nodePortKey]bool{}
			}
			ports[k] = true
		}
	}
	occupy := func(sp *model.ServicePort, d int) {
		for i := range sp.Endpoints {
			e := &sp.Endpoints[i]
			if e.Addr.Is6() != a.v6 {
				continue
			}
			occ, ok := t.occupants[e.Addr]
			if !ok {
				continue
			}
			k := occupantOf(sp, e)
			n := occ[k] + d
			if n <= 0 {
				delete(occ, k)
			} else {
				occ[k] = n
			}
			if (d > 0 && n == 1) || (d < 0 && n == 0) {
				if shifted == nil {
					shifted = map[netip.Addr]bool{}
				}
				shifted[e.Addr] = true
			}
		}
	}
	for _, ch := range changes {
		if ch.old != nil {
			flip(t.countNodePorts(ch.old, -1))
		}
		if ch.new != nil {
			flip(t.countNodePorts(ch.new, +1))
		}
		if len(t.occupants) == 0 || (ch.old != nil && ch.new != nil && same(ch.old.Endpoints, ch.new.Endpoints) && ch.old.Created.Equal(ch.new.Created)) {
			continue
		}
		if ch.old != nil {
			occupy(ch.old, -1)
		}
		if ch.new != nil {
			occupy(ch.new, +1)
		}
	}
	return shifted, ports
}

// look finds the occupants of the addresses among addrs that are not watched yet, with
// one pass over every service port's endpoints, skipped when eps (the endpoint
// addresses' counts) says none of them can be an endpoint's.
func (t *claimTable) look(a *Admission, addrs []netip.Addr, services []*model.ServicePort, eps *addrCounts) {
	var fresh map[netip.Addr]map[occupant]int
	held := false
	for _, ip := range addrs {
		if _, ok := t.occupants[ip]; ok {
			continue
		}
		occ := map[occupant]int{}
		t.occupants[ip] = occ
		if *eps.bucket(ip) > 0 {
			if fresh == nil {
				fresh = map[netip.Addr]map[occupant]int{}
			}
			fresh[ip], held = occ, true
		}
	}
	if !held {
		return
	}
	for _, sp := range services {
		for i := range sp.Endpoints {
			if occ, ok := fresh[sp.Endpoints[i].Addr]; ok {
				occ[occupantOf(sp, &sp.Endpoints[i])]++
			}
		}
	}
}

// claimsOf returns the frontends and node port sp holds, its addresses appended to the
// per-call buffers of a (Claims.Clone copies them out).
func (t *claimTable) claimsOf(a *Admission, sp *model.ServicePort) Claims {
	var w Claims
	start := len(a.internal)
	for _, ip := range sp.ClusterIPs {
		if ip.Is6() == a.v6 && t.cluster.holds(frontendOf(sp, ip), sp) && !slices.Contains(a.internal[start:], ip) {
			a.internal = append(a.internal, ip)
		}
	}
	if len(a.internal) > start {
		w.Internal = a.internal[start:len(a.internal):len(a.internal)]
	}
	if !a.claimsExternal(sp) {
		return w
	}
	start = len(a.external)
	a.externalAddrs(sp, func(_ string, ip netip.Addr) {
		if t.external.holds(frontendOf(sp, ip), sp) && !slices.Contains(a.external[start:], ip) {
			a.external = append(a.external, ip)
		}
	})
	if len(a.external) > start {
		w.External = a.external[start:len(a.external):len(a.external)]
	}
	if sp.NodePort != 0 && t.nodePort.holds(nodePortKey{sp.Name.Protocol, sp.NodePort}, sp) {
		w.NodePort = sp.NodePort
	}
	return w
}

// problems returns the refusals and the lost claims, sorted, each once.
func (t *claimTable) problems(a *Admission) []model.Problem {
	var out []model.Problem
	for _, ps := range t.refused {
		out = append(out, ps...)
	}
	lost := func(sp *model.ServicePort, format string, args ...any) {
		out = append(out, model.Problem{Kind: model.KindService, Namespace: sp.Name.Namespace, Name: sp.Name.Name,
			Reason: fmt.Sprintf("port %q: ", sp.Name.Port) + fmt.Sprintf(format, args...) + ", ignored"})
	}
	for _, m := range []*claimMap[frontendKey]{&t.cluster, &t.external} {
		for k := range m.contested {
			addr := netip.AddrFrom16(k.addr)
			if !a.v6 {
				addr = addr.Unmap()
			}
			for _, sp := range m.held[k].more {
				lost(sp, "%s %s:%d is in use by another Service", model.ProtoString(k.proto), addr, k.port)
			}
		}
	}
	for k := range t.nodePort.contested {
		for _, sp := range t.nodePort.held[k].more {
			lost(sp, "node port %s %d is in use by another Service", model.ProtoString(k.proto), k.port)
		}
	}
	slices.SortFunc(out, compareProblems)
	return slices.Compact(out)
}

func compareProblems(a, b model.Problem) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name), cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Reason, b.Reason))
}

// refusal says why ip may not be an external frontend of sp ("" if it may): the
// reasons of Admission.refusal, then what depends on other service ports. On this node's
// addresses, node ports and health-check node ports come first: an externalIP or
// load-balancer IP there never takes one. And no external frontend takes the address,
// protocol and port of an endpoint of an older Service in another namespace (a pod's,
// or a host-network pod's on a node address): the pod's own node would send that
// Service's traffic to the tenant. (Older: an endpoint a tenant writes into a slice of
// a newer Service cannot take an existing externalIP away.) The reasons name no other
// Service or namespace.
func (t *claimTable) refusal(a *Admission, sp *model.ServicePort, what string, ip netip.Addr) string {
	if reason := a.refusal(sp, what, ip); reason != "" {
		return reason
	}
	if a.ownAddr(ip) && t.nodePorts[nodePortKey{sp.Name.Protocol, sp.Port}] > 0 {
		return fmt.Sprintf("port %q: %s %s is this node's address and %s port %d is a node port or health-check node port, refused",
			sp.Name.Port, what, ip, model.ProtoString(sp.Name.Protocol), sp.Port)
	}
	for k, n := range t.occupants[ip] {
		if n > 0 && k.proto == sp.Name.Protocol && k.port == sp.Port && k.of.Namespace != sp.Name.Namespace && k.before(sp) {
			return fmt.Sprintf("port %q: %s %s %s port %d is an endpoint of a Service in another namespace, refused",
				sp.Name.Port, what, ip, model.ProtoString(sp.Name.Protocol), sp.Port)
		}
	}
	return ""
}

// ownAddr reports whether ip is one of this node's addresses that nftproxy knows.
func (a *Admission) ownAddr(ip netip.Addr) bool {
	return slices.Contains(a.node.IPs, ip) || slices.Contains(a.ownAddrs, ip) || slices.Contains(a.policy.OwnAddrs, ip)
}

// refusal says why ip may not be an external frontend of sp whatever the other service
// ports are ("" if it may).
func (a *Admission) refusal(sp *model.ServicePort, what string, ip netip.Addr) string {
	switch {
	case model.SpecialAddr(ip) != "":
		return fmt.Sprintf("%s %s is %s, refused", what, ip, model.SpecialAddr(ip))
	case a.clusterIPs[ip] > 0:
		return fmt.Sprintf("%s %s is a cluster IP, refused", what, ip)
	}
	for _, cidr := range a.serviceCIDRs {
		if cidr.Contains(ip) {
			return fmt.Sprintf("%s %s is inside the service CIDR %s, refused", what, ip, cidr)
		}
	}
	if what == whatExternalIP && len(a.policy.ExternalIPCIDRs) > 0 && !slices.ContainsFunc(a.policy.ExternalIPCIDRs, func(p netip.Prefix) bool { return p.Contains(ip) }) {
		return fmt.Sprintf("%s %s is outside the ranges the node allows externalIPs in (--external-ip-cidrs), refused", what, ip)
	}
	for _, cidr := range a.policy.ClusterCIDRs {
		if cidr.Contains(ip) {
			return fmt.Sprintf("%s %s is inside the cluster CIDR %s (pod addresses), refused", what, ip, cidr)
		}
	}
	for _, cidr := range a.node.PodCIDRs {
		if cidr.Contains(ip) {
			return fmt.Sprintf("%s %s is inside this node's pod CIDR %s, refused", what, ip, cidr)
		}
	}
	if sp.Name.Protocol == model.ProtoTCP && slices.Contains(a.policy.ServedPorts, sp.Port) && a.ownAddr(ip) {
		return fmt.Sprintf("port %q: %s %s is this node's address and TCP port %d is served by nftproxy itself, refused", sp.Name.Port, what, ip, sp.Port)
	}
	return ""
}

// frontendKey is an address, protocol and port; the address is kept as 16 bytes so that
// the claim map holds no pointer for the collector to scan (one Admission serves one
// family, so an IPv4 address and its IPv4-mapped IPv6 form never meet).
type frontendKey struct {
	addr  [16]byte
	proto uint8
	port  uint16
}

type nodePortKey struct {
	proto uint8
	port  uint16
}
