package compile

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
func (c *compiler) claimsExternal(sp *model.ServicePort) bool {
	return sp.NodePort != 0 || len(sp.LoadBalancerIPs) > 0 || (len(sp.ExternalIPs) > 0 && !c.cfg.NoExternalIPs)
}

// externalAddrs calls f with each external and load-balancer IP of sp in the family,
// and what it is.
func (c *compiler) externalAddrs(sp *model.ServicePort, f func(what string, ip netip.Addr)) {
	for k, ips := range [2][]netip.Addr{sp.ExternalIPs, sp.LoadBalancerIPs} {
		if k == 0 && c.cfg.NoExternalIPs {
			continue
		}
		what := [2]string{"externalIP", "load-balancer IP"}[k]
		for _, ip := range ips {
			if ip.Is6() == c.v6 {
				f(what, ip)
			}
		}
	}
}

func frontendOf(sp *model.ServicePort, ip netip.Addr) frontendKey {
	return frontendKey{ip.As16(), sp.Name.Protocol, sp.Port}
}

// add enters sp's claims (sp has a cluster IP in the family and is not set aside).
func (t *claimTable) add(c *compiler, sp *model.ServicePort) {
	for _, ip := range sp.ClusterIPs {
		if ip.Is6() == c.v6 {
			t.cluster.add(frontendOf(sp, ip), sp, t.affected)
		}
	}
	if !c.claimsExternal(sp) {
		return
	}
	var refused []model.Problem
	external := false
	c.externalAddrs(sp, func(what string, ip netip.Addr) {
		external = true
		if reason := c.refusal(sp, what, ip); reason != "" {
			refused = append(refused, model.Problem{Kind: "Service", Namespace: sp.Name.Namespace, Name: sp.Name.Name, Reason: reason})
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
func (t *claimTable) remove(c *compiler, sp *model.ServicePort) {
	for _, ip := range sp.ClusterIPs {
		if ip.Is6() == c.v6 {
			t.cluster.remove(frontendOf(sp, ip), sp, t.affected)
		}
	}
	if !c.claimsExternal(sp) {
		return
	}
	c.externalAddrs(sp, func(_ string, ip netip.Addr) { t.external.remove(frontendOf(sp, ip), sp, t.affected) })
	delete(t.withExternal, sp)
	delete(t.refused, sp)
	if sp.NodePort != 0 {
		t.nodePort.remove(nodePortKey{sp.Name.Protocol, sp.NodePort}, sp, t.affected)
	}
}

// fill enters the claims of every service port that claims (state is stateHas) into an
// empty table, ordering each contested key's claimants once at the end.
func (t *claimTable) fill(c *compiler, services []*model.ServicePort, state []uint8) {
	t.cluster.filling, t.external.filling, t.nodePort.filling = true, true, true
	for i, sp := range services {
		if state[i] == stateHas {
			t.add(c, sp)
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
func (t *claimTable) update(c *compiler, changes []portChange, state []uint8, moved map[netip.Addr]bool) {
	clear(t.affected)
	for _, ch := range changes {
		if ch.old != nil && ch.oldState == stateHas {
			t.remove(c, ch.old)
		}
	}
	var again []*model.ServicePort
	if len(moved) > 0 {
		for sp := range t.withExternal {
			hit := false
			c.externalAddrs(sp, func(_ string, ip netip.Addr) { hit = hit || moved[ip] })
			if hit {
				again = append(again, sp)
			}
		}
		for _, sp := range again {
			t.remove(c, sp)
		}
	}
	for _, ch := range changes {
		if ch.new != nil && state[ch.at] == stateHas {
			t.add(c, ch.new)
		}
	}
	for _, sp := range again {
		t.add(c, sp)
		t.affected[sp] = true
	}
}

// claimsOf returns the frontends and node port sp holds, its addresses appended to the
// per-call buffers of sc (claims.clone copies them out).
func (t *claimTable) claimsOf(c *compiler, sp *model.ServicePort, sc *scratch) claims {
	var w claims
	start := len(sc.internal)
	for _, ip := range sp.ClusterIPs {
		if ip.Is6() == c.v6 && t.cluster.holds(frontendOf(sp, ip), sp) && !slices.Contains(sc.internal[start:], ip) {
			sc.internal = append(sc.internal, ip)
		}
	}
	if len(sc.internal) > start {
		w.internal = sc.internal[start:len(sc.internal):len(sc.internal)]
	}
	if !c.claimsExternal(sp) {
		return w
	}
	start = len(sc.external)
	c.externalAddrs(sp, func(_ string, ip netip.Addr) {
		if t.external.holds(frontendOf(sp, ip), sp) && !slices.Contains(sc.external[start:], ip) {
			sc.external = append(sc.external, ip)
		}
	})
	if len(sc.external) > start {
		w.external = sc.external[start:len(sc.external):len(sc.external)]
	}
	if sp.NodePort != 0 && t.nodePort.holds(nodePortKey{sp.Name.Protocol, sp.NodePort}, sp) {
		w.nodePort = sp.NodePort
	}
	return w
}

// problems returns the refusals and the lost claims, sorted, each once.
func (t *claimTable) problems(c *compiler) []model.Problem {
	var out []model.Problem
	for _, ps := range t.refused {
		out = append(out, ps...)
	}
	lost := func(sp *model.ServicePort, format string, args ...any) {
		out = append(out, model.Problem{Kind: "Service", Namespace: sp.Name.Namespace, Name: sp.Name.Name,
			Reason: fmt.Sprintf("port %q: ", sp.Name.Port) + fmt.Sprintf(format, args...) + ", ignored"})
	}
	for _, m := range []*claimMap[frontendKey]{&t.cluster, &t.external} {
		for k := range m.contested {
			addr := netip.AddrFrom16(k.addr)
			if !c.v6 {
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

// refusal says why ip may not be an external frontend of sp ("" if it may).
func (c *compiler) refusal(sp *model.ServicePort, what string, ip netip.Addr) string {
	switch {
	case model.SpecialAddr(ip) != "":
		return fmt.Sprintf("%s %s is %s, refused", what, ip, model.SpecialAddr(ip))
	case c.clusterIPSet[ip] > 0:
		return fmt.Sprintf("%s %s is a cluster IP, refused", what, ip)
	}
	for _, cidr := range c.serviceCIDRs {
		if cidr.Contains(ip) {
			return fmt.Sprintf("%s %s is inside the service CIDR %s, refused", what, ip, cidr)
		}
	}
	if sp.Name.Protocol == model.ProtoTCP && slices.Contains(c.cfg.ServedPorts, sp.Port) && c.ownAddr(ip) {
		return fmt.Sprintf("port %q: %s %s is this node's address and TCP port %d is served by nftproxy itself, refused", sp.Name.Port, what, ip, sp.Port)
	}
	return ""
}
