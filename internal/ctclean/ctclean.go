// Package ctclean removes UDP conntrack entries that would keep clients talking to
// nothing. UDP has no connection to close: a client that keeps its source port keeps its
// conntrack entry, and with it a DNAT to an endpoint that is gone, or the memory of a
// service that had no endpoint. Only the affected entries are deleted, never the table.
package ctclean

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"

	"github.com/nftproxy/nftproxy/internal/model"
)

// Flow selects UDP conntrack entries: by original destination (an address, or any
// address when Dst is invalid, and a port) and, if set, by the reply's source, i.e. the
// endpoint the entry was DNATed to.
type Flow struct {
	Dst      netip.Addr
	DstPort  uint16
	Endpoint netip.Addr
}

func (f Flow) String() string {
	dst := "*"
	if f.Dst.IsValid() {
		dst = f.Dst.String()
	}
	if f.Endpoint.IsValid() {
		return fmt.Sprintf("udp to %s:%d via %s", dst, f.DstPort, f.Endpoint)
	}
	return fmt.Sprintf("udp to %s:%d", dst, f.DstPort)
}

// Usable returns the endpoints traffic of a service port may reach on this node.
type Usable func(sp *model.ServicePort, node model.Node) []model.Endpoint

// Categorized is the default Usable: the union of the cluster-policy and local-policy
// endpoints of both families.
func Categorized(sp *model.ServicePort, node model.Node) []model.Endpoint {
	var out []model.Endpoint
	seen := map[netip.AddrPort]bool{}
	for _, v6 := range []bool{false, true} {
		var eps []model.Endpoint
		for _, e := range sp.Endpoints {
			if e.Addr.Is6() == v6 {
				eps = append(eps, e)
			}
		}
		c := model.Categorize(sp, eps, node)
		for _, e := range append(c.Cluster, c.Local...) {
			if !seen[e.AddrPort()] {
				seen[e.AddrPort()] = true
				out = append(out, e)
			}
		}
	}
	return out
}

// Stale returns the UDP flows to delete after the dataplane moved from prev to cur:
// entries DNATed to an endpoint a service port can no longer use, and entries for the
// frontends of a service port that had no usable endpoint before and has one now.
func Stale(prev, cur *model.Snapshot, usable Usable) []Flow {
	if prev == nil {
		return nil
	}
	now := map[model.ServicePortName]*model.ServicePort{}
	for i := range cur.Services {
		now[cur.Services[i].Name] = &cur.Services[i]
	}
	var out []Flow
	for i := range prev.Services {
		old := &prev.Services[i]
		if old.Name.Protocol != model.ProtoUDP {
			continue
		}
		had := usable(old, prev.Node)
		var has []model.Endpoint
		if sp := now[old.Name]; sp != nil {
			has = usable(sp, cur.Node)
		}
		keep := map[netip.Addr]bool{}
		for _, e := range has {
			keep[e.Addr] = true
		}
		for _, e := range had {
			if !keep[e.Addr] {
				out = append(out, frontends(old, e.Addr)...)
			}
		}
	}
	for i := range cur.Services {
		sp := &cur.Services[i]
		if sp.Name.Protocol != model.ProtoUDP || len(usable(sp, cur.Node)) == 0 {
			continue
		}
		var had []model.Endpoint
		for j := range prev.Services {
			if prev.Services[j].Name == sp.Name {
				had = usable(&prev.Services[j], prev.Node)
			}
		}
		if len(had) == 0 {
			out = append(out, frontends(sp, netip.Addr{})...)
		}
	}
	return out
}

// frontends lists a service port's destinations, optionally restricted to entries DNATed
// to endpoint.
func frontends(sp *model.ServicePort, endpoint netip.Addr) []Flow {
	var out []Flow
	for _, ips := range [][]netip.Addr{sp.ClusterIPs, sp.ExternalIPs, sp.LoadBalancerIPs} {
		for _, ip := range ips {
			if !endpoint.IsValid() || ip.Is6() == endpoint.Is6() {
				out = append(out, Flow{Dst: ip, DstPort: sp.Port, Endpoint: endpoint})
			}
		}
	}
	if sp.NodePort != 0 {
		out = append(out, Flow{DstPort: sp.NodePort, Endpoint: endpoint})
	}
	return out
}

// Deleter is the part of a netlink handle the cleaner uses.
type Deleter interface {
	ConntrackDeleteFilters(table netlink.ConntrackTableType, family netlink.InetFamily, filters ...netlink.CustomConntrackFilter) (uint, error)
}

// Clean deletes the entries the flows select, with one request per address family.
func Clean(d Deleter, flows []Flow) (int, error) {
	var v4, v6 []netlink.CustomConntrackFilter
	for _, f := range flows {
		filter, err := Filter(f)
		if err != nil {
			return 0, fmt.Errorf("conntrack filter for %s: %w", f, err)
		}
		is6 := f.Dst.Is6() || (!f.Dst.IsValid() && f.Endpoint.Is6())
		if is6 {
			v6 = append(v6, filter)
		} else {
			v4 = append(v4, filter)
		}
		if !f.Dst.IsValid() && !f.Endpoint.IsValid() {
			v6 = append(v6, filter) // a node port of a service that had no endpoint: both families
		}
	}
	var total uint
	var errs []error
	for _, batch := range []struct {
		fam     netlink.InetFamily
		filters []netlink.CustomConntrackFilter
	}{{netlink.FAMILY_V4, v4}, {netlink.FAMILY_V6, v6}} {
		if len(batch.filters) == 0 {
			continue
		}
		n, err := d.ConntrackDeleteFilters(netlink.ConntrackTable, batch.fam, batch.filters...)
		total += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	return int(total), errors.Join(errs...)
}

// Filter builds the netlink conntrack filter of a flow.
func Filter(f Flow) (*netlink.ConntrackFilter, error) {
	filter := &netlink.ConntrackFilter{}
	if err := filter.AddProtocol(model.ProtoUDP); err != nil {
		return nil, err
	}
	if err := filter.AddPort(netlink.ConntrackOrigDstPort, f.DstPort); err != nil {
		return nil, err
	}
	if f.Dst.IsValid() {
		if err := filter.AddIP(netlink.ConntrackOrigDstIP, net.IP(f.Dst.AsSlice())); err != nil {
			return nil, err
		}
	}
	if f.Endpoint.IsValid() {
		if err := filter.AddIP(netlink.ConntrackReplySrcIP, net.IP(f.Endpoint.AsSlice())); err != nil {
			return nil, err
		}
	}
	return filter, nil
}
