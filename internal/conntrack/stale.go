package conntrack

import (
	"net/netip"
	"slices"

	"github.com/nftproxy/nftproxy/internal/model"
)

// UsableFunc returns the endpoints of a service port that new connections may use.
type UsableFunc func(sp *model.ServicePort) []model.Endpoint

// Usable is the default UsableFunc: model.UsableEndpoints applied to each address
// family on its own, so that the terminating fallback of one family does not depend on
// the other family's ready endpoints.
func Usable(sp *model.ServicePort) []model.Endpoint {
	v4 := model.UsableEndpoints(sp.Endpoints, func(e model.Endpoint) bool { return e.Addr.Is4() })
	v6 := model.UsableEndpoints(sp.Endpoints, func(e model.Endpoint) bool { return e.Addr.Is6() })
	return append(slices.Clip(v4), v6...)
}

// Serving is the UsableFunc of the proxy: the endpoints whose UDP flows are kept are
// the serving ones (model.ServingEndpoints), so a terminating endpoint drains its
// clients.
func Serving(sp *model.ServicePort) []model.Endpoint { return model.ServingEndpoints(sp.Endpoints) }

// ServingOrTerminating is the UsableFunc of the proxy with --udp-keep-terminating-flows:
// the UDP flows of an endpoint are kept while it serves and while it terminates, whether
// it still passes its readiness probe or not, and deleted once it leaves its
// EndpointSlice (or stops being ready without terminating: a failed probe). A stateful
// UDP protocol (SIP, QUIC, game sessions) then finishes its sessions on a pod that is
// shutting down, where kube-proxy moves them as soon as the pod stops serving.
func ServingOrTerminating(sp *model.ServicePort) []model.Endpoint {
	var out []model.Endpoint
	for _, e := range sp.Endpoints {
		if e.Ready || e.Serving || e.Terminating {
			out = append(out, e)
		}
	}
	return out
}

// Frontends are the frontends a service port holds in the ruleset: the cluster,
// external and load-balancer IPs it won (all families) and its node port (0: none).
type Frontends struct {
	IPs      []netip.Addr
	NodePort uint16
}

// Won maps each service port that holds a frontend to its frontends (see
// compile.Compiler.Won): what the ruleset really sends to its endpoints. A service port
// that is not in it holds none (set aside, or every frontend refused or lost).
type Won map[model.ServicePortName]Frontends

// Programmed is a snapshot and the frontends each of its service ports won in the
// rulesets compiled from it. Won nil stands for the frontends every service port
// declares (tools and tests without a ruleset).
type Programmed struct {
	Snap *model.Snapshot
	Won  Won
}

// frontends returns sp's frontends in one family.
func (p Programmed) frontends(sp *model.ServicePort, v6 bool) ([]netip.Addr, uint16) {
	if p.Won == nil {
		return frontendIPs(sp, v6), sp.NodePort
	}
	f := p.Won[sp.Name]
	return model.AddrsOf(f.IPs, v6), f.NodePort
}

// Stale returns the conntrack entries to delete after the proxy moved from prev to cur
// (either may be nil: no services), with Usable deciding which endpoints are in use and
// the frontends every service port declares. See StaleFrom.
func Stale(prev, cur *model.Snapshot) []Flow { return StaleWith(prev, cur, Usable) }

// StaleWith is Stale with usable deciding which endpoints are in use.
func StaleWith(prev, cur *model.Snapshot, usable UsableFunc) []Flow {
	return StaleFrom(Programmed{Snap: prev}, Programmed{Snap: cur}, usable)
}

// StaleFrom returns the conntrack entries to delete after the proxy moved from prev to
// cur, for UDP service ports only, sorted and without duplicates:
//
//   - for each endpoint usable in prev and no longer usable in cur (removed, not ready,
//     or its service port deleted), the entries from one of the frontends the port held
//     in prev (cluster, external and load-balancer IP:port, node port on any address)
//     that are DNATed to it;
//   - for each address family in which a port had no usable endpoint in prev and has
//     one in cur, the entries to the frontends it holds in cur that nothing DNATed
//     (their reply source is the frontend itself): they were created while the service
//     had no endpoint and would keep their packets away from the new ones.
//
// Only the frontends a port won count: an address it declares but another Service
// holds (or that was refused, such as another Service's cluster IP) carries the other
// Service's flows, which a change of this port's endpoints must never delete. Entries
// DNATed to endpoints that stay usable are never selected, so with prev nil (a restart)
// only the un-DNATed entries of ports with endpoints are.
func StaleFrom(prev, cur Programmed, usable UsableFunc) []Flow {
	before, after := udpPorts(prev, usable), udpPorts(cur, usable)
	var flows []Flow
	for name, old := range before {
		flows = append(flows, goneEndpoints(old, after[name])...)
	}
	for name, now := range after {
		flows = append(flows, firstEndpoints(before[name], now)...)
	}
	slices.SortFunc(flows, Flow.compare)
	return slices.Compact(flows)
}

// portState is a UDP service port with the endpoints in use.
type portState struct {
	sp     *model.ServicePort
	usable []model.Endpoint
	in     Programmed // whose frontends
}

func (p *portState) uses(ap netip.AddrPort) bool {
	return p != nil && slices.ContainsFunc(p.usable, func(e model.Endpoint) bool { return e.AddrPort() == ap })
}

func (p *portState) usesFamily(v6 bool) bool {
	return p != nil && slices.ContainsFunc(p.usable, func(e model.Endpoint) bool { return e.Addr.Is6() == v6 })
}

func udpPorts(p Programmed, usable UsableFunc) map[model.ServicePortName]*portState {
	ports := map[model.ServicePortName]*portState{}
	if p.Snap == nil {
		return ports
	}
	for _, sp := range p.Snap.Services {
		if sp.Name.Protocol == model.ProtoUDP {
			ports[sp.Name] = &portState{sp: sp, usable: usable(sp), in: p}
		}
	}
	return ports
}

// goneEndpoints selects the entries DNATed to endpoints of old that now (nil: the port
// is gone) no longer uses.
func goneEndpoints(old, now *portState) []Flow {
	var flows []Flow
	for _, e := range old.usable {
		if !now.uses(e.AddrPort()) {
			flows = append(flows, toEndpoint(old, e)...)
		}
	}
	return flows
}

// toEndpoint selects the entries from any frontend the port held to endpoint e.
func toEndpoint(p *portState, e model.Endpoint) []Flow {
	sp, v6 := p.sp, e.Addr.Is6()
	ips, nodePort := p.in.frontends(sp, v6)
	var flows []Flow
	for _, ip := range ips {
		flows = append(flows, Flow{Protocol: sp.Name.Protocol, IPv6: v6, OrigDstIP: ip, OrigDstPort: sp.Port,
			ReplySrcIP: e.Addr, ReplySrcPort: e.Port})
	}
	if nodePort != 0 {
		flows = append(flows, Flow{Protocol: sp.Name.Protocol, IPv6: v6, OrigDstPort: nodePort,
			ReplySrcIP: e.Addr, ReplySrcPort: e.Port})
	}
	return flows
}

// firstEndpoints selects the un-DNATed entries to the frontends of now in each family
// where old (nil: the port is new) had no usable endpoint and now has one.
func firstEndpoints(old, now *portState) []Flow {
	var flows []Flow
	for _, v6 := range []bool{false, true} {
		if now.usesFamily(v6) && !old.usesFamily(v6) {
			flows = append(flows, notDNATed(now, v6)...)
		}
	}
	return flows
}

// notDNATed selects the entries to the frontends the port holds in one family whose
// replies come from the frontend itself: nothing DNATed them.
func notDNATed(p *portState, v6 bool) []Flow {
	sp := p.sp
	ips, nodePort := p.in.frontends(sp, v6)
	var flows []Flow
	for _, ip := range ips {
		flows = append(flows, notDNATedTo(sp, ip))
	}
	if nodePort != 0 {
		// The node port is open on any node address, so the address is not known here;
		// the reply port still tells un-DNATed entries from DNATed ones.
		flows = append(flows, Flow{Protocol: sp.Name.Protocol, IPv6: v6, OrigDstPort: nodePort,
			ReplySrcPort: nodePort})
	}
	return flows
}

// notDNATedTo selects the entries of sp's protocol to ip and sp's port whose replies
// come from there too: nothing DNATed them. (A DNATed entry's replies come from the
// endpoint.)
func notDNATedTo(sp *model.ServicePort, ip netip.Addr) Flow {
	return Flow{Protocol: sp.Name.Protocol, IPv6: ip.Is6(), OrigDstIP: ip, OrigDstPort: sp.Port,
		ReplySrcIP: ip, ReplySrcPort: sp.Port}
}

// frontendIPs are the service IPs of sp in one family: cluster, external and
// load-balancer IPs.
func frontendIPs(sp *model.ServicePort, v6 bool) []netip.Addr {
	var ips []netip.Addr
	for _, list := range [][]netip.Addr{sp.ClusterIPs, sp.ExternalIPs, sp.LoadBalancerIPs} {
		ips = append(ips, model.AddrsOf(list, v6)...)
	}
	return ips
}
