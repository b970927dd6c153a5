package source

import (
	"strings"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/internal/model"
)

// slim is the informers' transform (with triggers.timed; the Services' and
// EndpointSlices' informers apply it as objects arrive, listing.go). The informer caches
// hold every Service and EndpointSlice of the cluster, so slim rebuilds each one with
// only what the proxy reads, packed into a few exact-sized allocations instead of the
// one-per-field, append-grown ones protobuf decoding leaves.
//
// Kept, of every object: name, namespace, uid, resourceVersion, generation,
// creationTimestamp (the model times a new Service's first sync from it),
// deletionTimestamp and deletionGracePeriodSeconds; uid and resourceVersion because
// the Warning events about bad input refer to the object by them. Dropped: labels and
// annotations (except as below: a Service's nftproxy.io/load-balancing), managedFields, ownerReferences, finalizers,
// generateName.
//
// Service: spec type, clusterIP(s), ports (name, protocol, port, nodePort),
// externalIPs, sessionAffinity and its config, loadBalancerSourceRanges, the traffic
// policies, healthCheckNodePort, and the load-balancer ingress IPs with their ipMode:
// what internal/model reads. Dropped: the selector (endpoints come from EndpointSlices),
// labels (the service-proxy-name and headless filters are label selectors the API
// server applies, filter.go), ports' targetPort and appProtocol, ipFamilies and
// ipFamilyPolicy (families are read from the addresses), trafficDistribution (the
// endpoints' hints carry it), externalName, loadBalancerIP, loadBalancerClass,
// allocateLoadBalancerNodePorts, ingress hostnames and ports, status conditions. A field
// the model starts reading must be added here: TestSlimBuildsTheSameModel compares
// the model built from fully populated objects with the one built from their slimmed
// copies.
//
// EndpointSlice: addressType; the service name label alone (the map is replaced only
// when it has other entries: a Go map costs about 300 bytes whatever its size up to 8);
// the trigger-time annotation when the caller times it (syncmetrics.go); per endpoint
// addresses, conditions, nodeName, zone and hints; ports. Dropped: targetRef, hostname,
// deprecatedTopology. Endpoints are rewritten in their own array when it is
// exact-sized (as the streamed lists decode them), else, like ports, copied into an
// exact-sized one; all endpoints' addresses share one []string backing array, all the
// slice's string bytes one allocation; condition and protocol pointers point to the
// shared values below, and endpoints with the node name or zone of a recent endpoint
// share its pointer. No state outlives the call: nothing a tenant writes into a slice
// is kept anywhere but in that slice's cache entry.
//
// Node (this node's only): the annotations, managedFields, ownerReferences, and the
// status' images and volumes are cleared; the rest stays as decoded.
//
// slim may be called again on an object it returned (client-go's watch-list start
// transforms an object twice): the result is equal.
func slim(obj any, timed func(*discovery.EndpointSlice) bool) any {
	switch o := obj.(type) {
	case *v1.Service:
		slimService(o)
	case *discovery.EndpointSlice:
		slimSlice(o, timed != nil && timed(o))
	case *v1.Node:
		o.ManagedFields, o.Annotations, o.OwnerReferences = nil, nil, nil
		o.Status.Images, o.Status.VolumesInUse, o.Status.VolumesAttached = nil, nil, nil
	default: // ServiceCIDRs: few
		if a, err := meta.Accessor(obj); err == nil {
			a.SetManagedFields(nil)
		}
	}
	return obj
}

// Shared targets of the pointers slim writes into cached objects. Informer caches are
// read-only (client-go's rule: a cached object is shared and must never be modified),
// and these values are shared by every cached object at once: nothing may ever write
// through a pointer read from an informer object (TestSlimSharedValuesStay).
var (
	sharedTrue, sharedFalse          = true, false
	sharedTCP, sharedUDP, sharedSCTP = v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP
	sharedITPCluster, sharedITPLocal = v1.ServiceInternalTrafficPolicyCluster, v1.ServiceInternalTrafficPolicyLocal
	sharedVIP, sharedProxyMode       = v1.LoadBalancerIPModeVIP, v1.LoadBalancerIPModeProxy
)

func shareBool(b *bool) *bool {
	switch {
	case b == nil:
		return nil
	case *b:
		return &sharedTrue
	}
	return &sharedFalse
}

func shareProtocol(p *v1.Protocol) *v1.Protocol {
	if p != nil {
		switch *p {
		case v1.ProtocolTCP:
			return &sharedTCP
		case v1.ProtocolUDP:
			return &sharedUDP
		case v1.ProtocolSCTP:
			return &sharedSCTP
		}
	}
	return p
}

// wellKnown are strings many objects hold (enum values, common port names): packEnum
// shares these static copies instead of copying them. A fixed list, never grown.
var wellKnown = func() map[string]string {
	m := map[string]string{}
	for _, s := range []string{"TCP", "UDP", "SCTP", "ClusterIP", "NodePort", "LoadBalancer", "ExternalName",
		"None", "ClientIP", "Cluster", "Local", "VIP", "Proxy", "IPv4", "IPv6",
		"http", "https", "grpc", "metrics", "dns", "dns-tcp", "tcp", "udp", "web"} {
		m[s] = s
	}
	return m
}()

// packer copies an object's strings into one allocation. An object is walked twice:
// the first walk (sizing) only adds up the lengths, the second copies each string into
// a buffer of exactly that size and returns the copy. A string equal to one of the last
// few packed is shared rather than copied again (the same decisions in both walks, so
// the size is exact).
type packer struct {
	sizing bool
	n      int
	b      strings.Builder
	recent [4]string
	next   int
}

func newPacker() *packer { return &packer{sizing: true} }

// copying ends the sizing walk.
func (p *packer) copying() {
	p.sizing, p.recent, p.next = false, [4]string{}, 0
	p.b.Grow(p.n)
}

func (p *packer) str(s string) string {
	if s == "" {
		return ""
	}
	for _, r := range p.recent {
		if r == s {
			return r
		}
	}
	if p.sizing {
		p.n += len(s)
	} else {
		off := p.b.Len()
		p.b.WriteString(s)
		// the buffer was grown to the exact total once: it is never reallocated, and
		// the bytes a returned string covers are never written again
		s = p.b.String()[off:]
	}
	p.recent[p.next] = s
	p.next = (p.next + 1) % len(p.recent)
	return s
}

// pack packs a string-typed field in place.
func pack[S ~string](p *packer, s *S) { *s = S(p.str(string(*s))) }

// packEnum packs a field that usually holds a well-known value: that value is not
// copied but shared.
func packEnum[S ~string](p *packer, s *S) {
	if c, ok := wellKnown[string(*s)]; ok {
		*s = S(c)
		return
	}
	pack(p, s)
}

func packAll(p *packer, ss []string) {
	for i := range ss {
		ss[i] = p.str(ss[i])
	}
}

// slimMeta keeps what is read of an object's metadata (see slim).
func slimMeta(m *metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion,
		Generation: m.Generation, CreationTimestamp: m.CreationTimestamp, DeletionTimestamp: m.DeletionTimestamp,
		DeletionGracePeriodSeconds: m.DeletionGracePeriodSeconds}
}

// The Service annotations slim keeps: only model.LoadBalancingAnnotation, its two
// valid values as maps shared by every cached Service (never written), any other value
// in a map of its own (the model reports it).
var (
	sharedBalancingRandom = map[string]string{model.LoadBalancingAnnotation: "random"}
	sharedBalancingMaglev = map[string]string{model.LoadBalancingAnnotation: "maglev"}
)

func balancingAnnotation(a map[string]string) map[string]string {
	v, ok := a[model.LoadBalancingAnnotation]
	switch {
	case !ok:
		return nil
	case v == "random":
		return sharedBalancingRandom
	case v == "maglev":
		return sharedBalancingMaglev
	}
	return map[string]string{model.LoadBalancingAnnotation: v}
}

func (p *packer) meta(m *metav1.ObjectMeta) {
	pack(p, &m.Name)
	pack(p, &m.Namespace)
	pack(p, &m.UID)
	pack(p, &m.ResourceVersion)
}

// exact returns s in an array of its length (protobuf decoding grows arrays by append).
func exact[T any](s []T) []T {
	if s == nil || len(s) == cap(s) {
		return s
	}
	return append(make([]T, 0, len(s)), s...)
}

func slimService(o *v1.Service) {
	in := &o.Spec
	spec := v1.ServiceSpec{
		Type: in.Type, ClusterIP: in.ClusterIP, ClusterIPs: exact(in.ClusterIPs), ExternalIPs: exact(in.ExternalIPs),
		SessionAffinity: in.SessionAffinity, SessionAffinityConfig: in.SessionAffinityConfig,
		LoadBalancerSourceRanges: exact(in.LoadBalancerSourceRanges),
		ExternalTrafficPolicy:    in.ExternalTrafficPolicy, HealthCheckNodePort: in.HealthCheckNodePort,
		InternalTrafficPolicy: in.InternalTrafficPolicy,
	}
	if t := in.InternalTrafficPolicy; t != nil {
		switch *t {
		case v1.ServiceInternalTrafficPolicyCluster:
			spec.InternalTrafficPolicy = &sharedITPCluster
		case v1.ServiceInternalTrafficPolicyLocal:
			spec.InternalTrafficPolicy = &sharedITPLocal
		}
	}
	if in.Ports != nil {
		spec.Ports = make([]v1.ServicePort, len(in.Ports))
		for i, sp := range in.Ports {
			spec.Ports[i] = v1.ServicePort{Name: sp.Name, Protocol: sp.Protocol, Port: sp.Port, NodePort: sp.NodePort}
		}
	}
	var status v1.ServiceStatus
	if ing := o.Status.LoadBalancer.Ingress; ing != nil {
		status.LoadBalancer.Ingress = make([]v1.LoadBalancerIngress, len(ing))
		for i, g := range ing {
			out := &status.LoadBalancer.Ingress[i]
			out.IP, out.IPMode = g.IP, g.IPMode
			if g.IPMode != nil {
				switch *g.IPMode {
				case v1.LoadBalancerIPModeVIP:
					out.IPMode = &sharedVIP
				case v1.LoadBalancerIPModeProxy:
					out.IPMode = &sharedProxyMode
				}
			}
		}
	}
	balancing := balancingAnnotation(o.Annotations)
	*o = v1.Service{TypeMeta: o.TypeMeta, ObjectMeta: slimMeta(&o.ObjectMeta), Spec: spec, Status: status}
	o.Annotations = balancing

	p := newPacker()
	for range 2 {
		p.meta(&o.ObjectMeta)
		s := &o.Spec
		packEnum(p, &s.Type)
		pack(p, &s.ClusterIP)
		packAll(p, s.ClusterIPs)
		for i := range s.Ports {
			packEnum(p, &s.Ports[i].Name)
			packEnum(p, &s.Ports[i].Protocol)
		}
		packAll(p, s.ExternalIPs)
		packEnum(p, &s.SessionAffinity)
		packAll(p, s.LoadBalancerSourceRanges)
		packEnum(p, &s.ExternalTrafficPolicy)
		for i := range o.Status.LoadBalancer.Ingress {
			pack(p, &o.Status.LoadBalancer.Ingress[i].IP)
		}
		p.copying()
	}
}

// recentPtrs remembers the last few distinct values of a slice's endpoints' nodeName
// (or zone), so that an endpoint with one of them shares its pointer.
type recentPtrs struct {
	ptrs [4]*string
	next int
}

func (r *recentPtrs) find(s string) *string {
	for _, p := range r.ptrs {
		if p != nil && *p == s {
			return p
		}
	}
	return nil
}

func (r *recentPtrs) add(p *string) {
	r.ptrs[r.next] = p
	r.next = (r.next + 1) % len(r.ptrs)
}

// slimSlice rebuilds an EndpointSlice (see slim); timed keeps its trigger time.
func slimSlice(o *discovery.EndpointSlice, timed bool) {
	a := newSliceArena(o)
	eps := a.endpoints(o.Endpoints)
	ports := a.ports(o.Ports)
	*o = discovery.EndpointSlice{TypeMeta: o.TypeMeta, ObjectMeta: slimSliceMeta(o, timed), AddressType: o.AddressType, Endpoints: eps, Ports: ports}
	a.pack(o)
}

// sliceArena holds the exact-sized arrays a slimmed EndpointSlice's endpoints and ports
// point into: the addresses, then the distinct node names and zones, port names and app
// protocols in one []string; the hints and their zones and nodes. Each part is handed
// out from the front as the endpoints and ports are rebuilt.
type sliceArena struct {
	allStrs  []string
	addrs    []string // the addresses not handed out yet
	strs     []string // the other strings not handed out yet
	hints    []discovery.EndpointHints
	forZones []discovery.ForZone
	forNodes []discovery.ForNode
	allZones []discovery.ForZone
	allNodes []discovery.ForNode
}

// newSliceArena counts what o's arrays hold (the distinct node names and zones as
// endpoints rebuilds them) and allocates them.
func newSliceArena(o *discovery.EndpointSlice) sliceArena {
	nAddrs, nStr, nHints, nZones, nNodes := 0, 0, 0, 0, 0
	var nodes, zones recentPtrs
	for i := range o.Endpoints {
		e := &o.Endpoints[i]
		nAddrs += len(e.Addresses)
		if e.NodeName != nil && nodes.find(*e.NodeName) == nil {
			nodes.add(e.NodeName)
			nStr++
		}
		if e.Zone != nil && zones.find(*e.Zone) == nil {
			zones.add(e.Zone)
			nStr++
		}
		if e.Hints != nil {
			nHints++
			nZones += len(e.Hints.ForZones)
			nNodes += len(e.Hints.ForNodes)
		}
	}
	for _, pt := range o.Ports {
		if pt.Name != nil {
			nStr++
		}
		if pt.AppProtocol != nil {
			nStr++
		}
	}
	a := sliceArena{allStrs: make([]string, nAddrs+nStr), // the addresses, then the others
		hints:    make([]discovery.EndpointHints, nHints),
		forZones: make([]discovery.ForZone, nZones),
		forNodes: make([]discovery.ForNode, nNodes)}
	a.addrs, a.strs = a.allStrs[:nAddrs:nAddrs], a.allStrs[nAddrs:]
	a.allZones, a.allNodes = a.forZones, a.forNodes
	return a
}

// str puts a string into the arena and returns its address.
func (a *sliceArena) str(s string) *string {
	a.strs[0] = s
	p := &a.strs[0]
	a.strs = a.strs[1:]
	return p
}

// endpoints rewrites the endpoints into their own array when it is exact-sized (the
// streamed lists decode them into one, listing.go), else into a new one.
func (a *sliceArena) endpoints(in []discovery.Endpoint) []discovery.Endpoint {
	eps := in
	if len(eps) != cap(eps) {
		eps = make([]discovery.Endpoint, len(in))
	}
	var nodes, zones recentPtrs
	for i := range in {
		e, out := in[i], &eps[i] // e: a copy, as out may be the same element
		*out = discovery.Endpoint{}
		if e.Addresses != nil {
			n := copy(a.addrs, e.Addresses)
			out.Addresses, a.addrs = a.addrs[:n:n], a.addrs[n:]
		}
		out.Conditions = discovery.EndpointConditions{Ready: shareBool(e.Conditions.Ready),
			Serving: shareBool(e.Conditions.Serving), Terminating: shareBool(e.Conditions.Terminating)}
		if e.NodeName != nil {
			if out.NodeName = nodes.find(*e.NodeName); out.NodeName == nil {
				out.NodeName = a.str(*e.NodeName)
				nodes.add(out.NodeName)
			}
		}
		if e.Zone != nil {
			if out.Zone = zones.find(*e.Zone); out.Zone == nil {
				out.Zone = a.str(*e.Zone)
				zones.add(out.Zone)
			}
		}
		if e.Hints != nil {
			out.Hints = a.hint(e.Hints)
		}
	}
	return eps
}

// hint copies h into the arena.
func (a *sliceArena) hint(h *discovery.EndpointHints) *discovery.EndpointHints {
	out := &a.hints[0]
	a.hints = a.hints[1:]
	if h.ForZones != nil {
		n := copy(a.forZones, h.ForZones)
		out.ForZones, a.forZones = a.forZones[:n:n], a.forZones[n:]
	}
	if h.ForNodes != nil {
		n := copy(a.forNodes, h.ForNodes)
		out.ForNodes, a.forNodes = a.forNodes[:n:n], a.forNodes[n:]
	}
	return out
}

// ports copies the ports into an exact-sized array, their numbers into another.
func (a *sliceArena) ports(in []discovery.EndpointPort) []discovery.EndpointPort {
	if in == nil {
		return nil
	}
	ports := make([]discovery.EndpointPort, len(in))
	n := 0
	for _, pt := range in {
		if pt.Port != nil {
			n++
		}
	}
	portNums := make([]int32, n)
	for i, pt := range in {
		out := &ports[i]
		out.Protocol = shareProtocol(pt.Protocol)
		if pt.Name != nil {
			out.Name = a.str(*pt.Name)
		}
		if pt.Port != nil {
			portNums[0] = *pt.Port
			out.Port, portNums = &portNums[0], portNums[1:]
		}
		if pt.AppProtocol != nil {
			out.AppProtocol = a.str(*pt.AppProtocol)
		}
	}
	return ports
}

// slimSliceMeta is o's metadata as slim keeps it: the service name label alone (the map
// is replaced only when it has other entries), the trigger time only when timed.
func slimSliceMeta(o *discovery.EndpointSlice, timed bool) metav1.ObjectMeta {
	m := slimMeta(&o.ObjectMeta)
	if svc, ok := o.Labels[discovery.LabelServiceName]; ok {
		m.Labels = o.Labels
		if len(o.Labels) > 1 {
			m.Labels = map[string]string{discovery.LabelServiceName: svc}
		}
	}
	if v, ok := o.Annotations[TriggerTimeAnnotation]; ok && timed {
		m.Annotations = map[string]string{TriggerTimeAnnotation: v}
	}
	return m
}

// pack moves the rebuilt slice's strings into one allocation: a first round sizes it,
// the second copies.
func (a *sliceArena) pack(o *discovery.EndpointSlice) {
	p := newPacker()
	for range 2 {
		p.meta(&o.ObjectMeta)
		packEnum(p, &o.AddressType)
		if v, ok := o.Labels[discovery.LabelServiceName]; ok && len(o.Labels) == 1 {
			o.Labels[discovery.LabelServiceName] = p.str(v)
		}
		if v, ok := o.Annotations[TriggerTimeAnnotation]; ok {
			o.Annotations[TriggerTimeAnnotation] = p.str(v)
		}
		// every other string is in the arrays built above, each once (an endpoint's
		// shared node name or zone too)
		packAll(p, a.allStrs)
		for i := range a.allZones {
			pack(p, &a.allZones[i].Name)
		}
		for i := range a.allNodes {
			pack(p, &a.allNodes[i].Name)
		}
		p.copying()
	}
}
