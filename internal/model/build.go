package model

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

// Inputs are everything a Snapshot is built from: the API objects, and what the proxy
// resolved before building (so that the snapshot is complete when built and never
// written afterwards).
type Inputs struct {
	Services []*v1.Service
	Slices   []*discovery.EndpointSlice
	Node     *v1.Node // this node's Node object; nil: not known yet
	// ServiceCIDRs: the ServiceCIDR objects' ranges, or --service-cluster-ip-range.
	ServiceCIDRs []netip.Prefix
	// NodePortAddrs: --nodeport-addresses resolved to this node's addresses (its
	// primary IPs by default).
	NodePortAddrs []netip.Addr
}

// Build turns Services, EndpointSlices and this node's Node object into a Snapshot
// without service CIDRs or node port addresses: BuildFrom with only those inputs.
func Build(services []*v1.Service, slices []*discovery.EndpointSlice, node *v1.Node) (*Snapshot, []Problem) {
	return BuildFrom(Inputs{Services: services, Slices: slices, Node: node})
}

// BuildFrom turns the inputs into a Snapshot. It is a pure function: anything it cannot
// use is skipped and reported as a Problem; it never fails as a whole.
func BuildFrom(in Inputs) (*Snapshot, []Problem) {
	b := &builder{}
	snap := newSnapshot(b, in)
	bySvc := b.groupSlices(in.Slices)
	for _, svc := range in.Services {
		snap.Services = appendPointers(snap.Services, b.service(svc, bySvc[nsName{svc.Namespace, svc.Name}]))
	}
	sort.Slice(snap.Services, func(i, j int) bool { return snap.Services[i].Name.Less(snap.Services[j].Name) })
	return snap, b.problems
}

// appendPointers appends a pointer to each of ports to dst.
func appendPointers(dst []*ServicePort, ports []ServicePort) []*ServicePort {
	for i := range ports {
		dst = append(dst, &ports[i])
	}
	return dst
}

// newSnapshot returns the snapshot of in without its services.
func newSnapshot(b *builder, in Inputs) *Snapshot {
	return &Snapshot{
		Node:          b.node(in.Node),
		ServiceCIDRs:  slices.Clip(slices.Clone(in.ServiceCIDRs)),
		NodePortAddrs: slices.Clip(slices.Clone(in.NodePortAddrs)),
	}
}

// NodeOf is what the proxy needs of a Node object (the Node of a Snapshot built with it).
func NodeOf(n *v1.Node) Node { return (&builder{}).node(n) }

type nsName struct{ ns, name string }

type builder struct {
	problems []Problem
	seen     map[Problem]bool // a slice read for several service ports reports once
}

func (b *builder) problem(kind ObjectKind, ns, name, format string, args ...any) {
	p := Problem{Kind: kind, Namespace: ns, Name: name, Reason: fmt.Sprintf(format, args...)}
	if b.seen[p] {
		return
	}
	if b.seen == nil {
		b.seen = map[Problem]bool{}
	}
	b.seen[p] = true
	b.problems = append(b.problems, p)
}

func (b *builder) node(n *v1.Node) Node {
	if n == nil {
		return Node{}
	}
	out := Node{Name: n.Name, Zone: n.Labels[v1.LabelTopologyZone]}
	for _, c := range n.Spec.PodCIDRs {
		p, err := netip.ParsePrefix(c)
		if err != nil || slices.ContainsFunc(out.PodCIDRs, func(q netip.Prefix) bool { return q.Addr().Is6() == p.Addr().Is6() }) {
			continue // the API validates podCIDRs; one per family, as kube-proxy uses
		}
		out.PodCIDRs = append(out.PodCIDRs, p.Masked())
	}
	// Primary IPs as kubelet reports them: the first InternalIP of each family, or the
	// first ExternalIP when a family has no InternalIP.
	var have4, have6 bool
	for _, t := range []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP} {
		for _, a := range n.Status.Addresses {
			ip, err := parseIP(a.Address)
			if a.Type != t || err != nil {
				continue
			}
			if (ip.Is4() && !have4) || (ip.Is6() && !have6) {
				out.IPs = append(out.IPs, ip)
				have4, have6 = have4 || ip.Is4(), have6 || ip.Is6()
			}
		}
	}
	return out
}

// groupSlices indexes usable slices by service, in name order so that duplicates resolve
// the same way every time.
func (b *builder) groupSlices(slices []*discovery.EndpointSlice) map[nsName][]*discovery.EndpointSlice {
	sorted := append([]*discovery.EndpointSlice(nil), slices...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	out := map[nsName][]*discovery.EndpointSlice{}
	for _, s := range sorted {
		svc := s.Labels[discovery.LabelServiceName]
		if svc == "" {
			continue
		}
		if s.AddressType != discovery.AddressTypeIPv4 && s.AddressType != discovery.AddressTypeIPv6 {
			continue // FQDN slices are not proxied
		}
		k := nsName{s.Namespace, svc}
		out[k] = append(out[k], s)
	}
	return out
}

func (b *builder) service(svc *v1.Service, slices []*discovery.EndpointSlice) []ServicePort {
	if svc.Spec.Type == v1.ServiceTypeExternalName {
		return nil
	}
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	if len(ips) == 0 || ips[0] == v1.ClusterIPNone {
		return nil // headless
	}
	clusterIPs := b.addrs(KindService, svc.Namespace, svc.Name, "clusterIP", ips)
	if len(clusterIPs) == 0 {
		return nil
	}
	externalIPs := b.addrs(KindService, svc.Namespace, svc.Name, "externalIP", svc.Spec.ExternalIPs)
	var lbIPs []netip.Addr
	if svc.Spec.Type == v1.ServiceTypeLoadBalancer {
		for _, ing := range svc.Status.LoadBalancer.Ingress {
			if ing.IP == "" || (ing.IPMode != nil && *ing.IPMode == v1.LoadBalancerIPModeProxy) {
				continue
			}
			lbIPs = append(lbIPs, b.addrs(KindService, svc.Namespace, svc.Name, "load-balancer ingress IP", []string{ing.IP})...)
		}
	}
	var out []ServicePort
	seenPort := map[string]bool{}
	for _, p := range svc.Spec.Ports {
		if seenPort[p.Name] { // the API requires unique port names (and a name when there are several)
			b.problem(KindService, svc.Namespace, svc.Name, "port %q: another port has the same name, port skipped", p.Name)
			continue
		}
		seenPort[p.Name] = true
		proto, ok := protocol(p.Protocol)
		if !ok {
			b.problem(KindService, svc.Namespace, svc.Name, "port %q: unsupported protocol %q, port skipped", p.Name, p.Protocol)
			continue
		}
		if p.Port <= 0 || p.Port > 65535 {
			b.problem(KindService, svc.Namespace, svc.Name, "port %q: invalid port number %d, port skipped", p.Name, p.Port)
			continue
		}
		sp := ServicePort{
			Name:            ServicePortName{Namespace: svc.Namespace, Name: svc.Name, Port: p.Name, Protocol: proto},
			ClusterIPs:      clusterIPs,
			Port:            uint16(p.Port),
			ExternalIPs:     externalIPs,
			LoadBalancerIPs: lbIPs,
			Created:         svc.CreationTimestamp.Time,
		}
		if svc.Spec.Type == v1.ServiceTypeNodePort || svc.Spec.Type == v1.ServiceTypeLoadBalancer {
			if p.NodePort > 0 && p.NodePort <= 65535 {
				sp.NodePort = uint16(p.NodePort)
			}
		}
		sp.Endpoints = b.endpoints(p.Name, proto, slices)
		b.policies(svc, &sp)
		out = append(out, sp)
	}
	return out
}

// Session affinity timeouts: kube-proxy's default, and the API's maximum.
const (
	DefaultAffinityTimeout = 10800
	MaxAffinityTimeout     = 86400
)

// policies fills traffic policies, health check port, affinity and source ranges.
func (b *builder) policies(svc *v1.Service, sp *ServicePort) {
	sp.InternalPolicyLocal = svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == v1.ServiceInternalTrafficPolicyLocal
	sp.ExternalPolicyLocal = sp.ExternallyAccessible() && svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal
	// Like kube-proxy, serve the health check for every Local-policy load balancer, even
	// before it has an ingress IP: a cloud load balancer may already be probing.
	if svc.Spec.Type == v1.ServiceTypeLoadBalancer && svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal &&
		svc.Spec.HealthCheckNodePort > 0 && svc.Spec.HealthCheckNodePort <= 65535 {
		sp.HealthCheckNodePort = uint16(svc.Spec.HealthCheckNodePort)
	}
	if v, ok := svc.Annotations[LoadBalancingAnnotation]; ok {
		if bal, ok := ParseBalancing(v); ok {
			sp.Balancing = bal
		} else {
			b.problem("Service", svc.Namespace, svc.Name, "annotation %s: %q is neither \"random\" nor \"maglev\", using the default", LoadBalancingAnnotation, v)
		}
	}
	if svc.Spec.SessionAffinity == v1.ServiceAffinityClientIP {
		t := int32(DefaultAffinityTimeout)
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			t = *c.ClientIP.TimeoutSeconds
		}
		switch {
		case t <= 0:
			b.problem(KindService, svc.Namespace, svc.Name, "sessionAffinityConfig.clientIP.timeoutSeconds %d is not positive, using %d", t, DefaultAffinityTimeout)
			t = DefaultAffinityTimeout
		case t > MaxAffinityTimeout:
			b.problem(KindService, svc.Namespace, svc.Name, "sessionAffinityConfig.clientIP.timeoutSeconds %d exceeds %d, using %d", t, MaxAffinityTimeout, MaxAffinityTimeout)
			t = MaxAffinityTimeout
		}
		sp.AffinityTimeout = uint32(t)
	}
	if len(sp.LoadBalancerIPs) > 0 {
		for _, r := range svc.Spec.LoadBalancerSourceRanges {
			if strings.TrimSpace(r) == "" {
				continue // as upstream: an empty entry means nothing
			}
			p, err := ParsePrefixSloppy(r)
			if err != nil {
				b.problem(KindService, svc.Namespace, svc.Name, "loadBalancerSourceRanges entry %q is not a CIDR; a family without a usable entry is closed to everyone", r)
				sp.SourceRangesBroken = true
				continue
			}
			sp.SourceRanges = append(sp.SourceRanges, p.Masked())
		}
	}
}

// parseIP parses an IP address as the API means it: an IPv4-mapped IPv6 address is its
// IPv4 address, and an IPv6 zone ("%eth0") is not an address the API accepts (two
// services could otherwise hold one address in two zones).
func parseIP(s string) (netip.Addr, error) {
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return ip, err
	}
	if ip.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("%q has a zone", s)
	}
	return ip.Unmap(), nil
}

// addrs parses a list of IP strings, reporting and skipping garbage, keeping at most one
// address per family for cluster IPs.
func (b *builder) addrs(kind ObjectKind, ns, name, what string, in []string) []netip.Addr {
	var out []netip.Addr
	for _, s := range in {
		ip, err := parseIP(s)
		if err != nil {
			b.problem(kind, ns, name, "%s %q is not an IP address, ignored", what, s)
			continue
		}
		out = append(out, ip)
	}
	return out
}

func protocol(p v1.Protocol) (uint8, bool) {
	switch p {
	case v1.ProtocolTCP, "":
		return ProtoTCP, true
	case v1.ProtocolUDP:
		return ProtoUDP, true
	case v1.ProtocolSCTP:
		return ProtoSCTP, true
	}
	return 0, false
}

// endpoints collects the endpoints of one service port from all of the service's slices:
// slice ports are matched by name (and protocol), duplicates count once.
func (b *builder) endpoints(portName string, proto uint8, slices []*discovery.EndpointSlice) []Endpoint {
	total := 0
	for _, s := range slices {
		total += len(s.Endpoints)
	}
	var out []Endpoint
	if total > 0 {
		out = make([]Endpoint, 0, total)
	}
	// duplicates (the same endpoint in two slices, as during a slice's replacement) are
	// found by a scan of out when it is small, by a map when it is large
	var seen map[netip.AddrPort]bool
	if total > 32 {
		seen = make(map[netip.AddrPort]bool, total)
	}
	dup := func(ap netip.AddrPort) bool {
		if seen != nil {
			if seen[ap] {
				return true
			}
			seen[ap] = true
			return false
		}
		for i := range out {
			if out[i].Addr == ap.Addr() && out[i].Port == ap.Port() {
				return true
			}
		}
		return false
	}
	for _, s := range slices {
		port, ok := b.slicePort(s, portName, proto)
		if !ok {
			continue
		}
		for i := range s.Endpoints {
			ep := &s.Endpoints[i]
			for _, a := range ep.Addresses {
				addr, err := parseIP(a)
				if err != nil || addr.Is4() != (s.AddressType == discovery.AddressTypeIPv4) {
					b.problem(KindEndpointSlice, s.Namespace, s.Name, "endpoint address %q is not an %s address, skipped", a, s.AddressType)
					continue
				}
				if why := SpecialAddr(addr); why != "" {
					b.problem(KindEndpointSlice, s.Namespace, s.Name, "endpoint address %s is %s, skipped", addr, why)
					continue
				}
				e := Endpoint{
					Addr:        addr.Unmap(),
					Port:        port,
					Ready:       ep.Conditions.Ready == nil || *ep.Conditions.Ready,
					Serving:     ep.Conditions.Serving == nil || *ep.Conditions.Serving,
					Terminating: ep.Conditions.Terminating != nil && *ep.Conditions.Terminating,
				}
				if ep.NodeName != nil {
					e.NodeName = *ep.NodeName
				}
				if ep.Zone != nil {
					e.Zone = *ep.Zone
				}
				if h := ep.Hints; h != nil && len(h.ForZones)+len(h.ForNodes) > 0 {
					e.Hints = &Hints{}
					for _, z := range h.ForZones {
						e.Hints.Zones = append(e.Hints.Zones, z.Name)
					}
					for _, n := range h.ForNodes {
						e.Hints.Nodes = append(e.Hints.Nodes, n.Name)
					}
				}
				if dup(e.AddrPort()) {
					break
				}
				out = append(out, e)
				break // only the first address of an endpoint is used, as upstream does
			}
		}
	}
	return out
}

// slicePort finds the slice's port for a service port, reporting unusable ones.
func (b *builder) slicePort(s *discovery.EndpointSlice, name string, proto uint8) (uint16, bool) {
	for _, p := range s.Ports {
		pname := ""
		if p.Name != nil {
			pname = *p.Name
		}
		if pname != name {
			continue
		}
		pproto := v1.ProtocolTCP
		if p.Protocol != nil {
			pproto = *p.Protocol
		}
		got, ok := protocol(pproto)
		if !ok {
			b.problem(KindEndpointSlice, s.Namespace, s.Name, "port %q: unsupported protocol %q, skipped", name, pproto)
			continue
		}
		if got != proto {
			continue
		}
		if p.Port == nil || *p.Port <= 0 || *p.Port > 65535 {
			b.problem(KindEndpointSlice, s.Namespace, s.Name, "port %q: invalid port number, skipped", name)
			return 0, false
		}
		return uint16(*p.Port), true
	}
	return 0, false
}
