package controller_test

// The fuzz targets' input format: a byte-driven generator of Services, EndpointSlices,
// a Node and the proxy configuration. The bytes are a header followed by operations,
// each a kind byte and a fixed-size record of single-byte fields (read with
// encoding/binary, zero-padded when the input ends early). Every field selects from a
// pool of hostile values by index modulo the pool size, so that any byte string is a
// valid input and a mutation of one byte changes one property of one object. The seed
// corpus is written from the same record types (fuzz_seeds_test.go).
//
// Objects are keyed by namespace and name (an upsert of an existing key replaces it), as
// in the informer caches the controller lists: the API never holds two objects with one
// key, but everything inside an object may be anything.

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"net/netip"
	"strings"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/internal/compile"
	proxyconfig "github.com/nftproxy/nftproxy/internal/config"
	"github.com/nftproxy/nftproxy/internal/controller"
	"github.com/nftproxy/nftproxy/internal/pipeline"
)

// Operation kinds (the kind byte modulo opKinds).
const (
	opService uint8 = iota
	opSlice
	opDeleteService
	opDeleteSlice
	opSync
	opNode
	opKinds
)

// Bounds that keep one input fast to compile.
const (
	maxOps      = 32
	maxSyncs    = 8
	maxServices = 8
	maxSlices   = 8
)

type header struct {
	Flags         uint8 // bit 0: --masquerade-all
	ClusterCIDRs  uint8
	NodePortAddrs uint8
	ServiceCIDRs  uint8
	MasqBit       uint8
	Node          nodeRec
}

type nodeRec struct {
	Present, Name, Zone uint8 // Present%5: 0 no Node object, else 1 + number of addresses
	Addrs               [3]nodeAddrRec
}

type nodeAddrRec struct{ Type, IP uint8 }

type svcRec struct {
	NS, Name, Type, ClusterIP uint8
	ClusterIPs                [3]uint8
	NPorts                    uint8
	Ports                     [4]portRec
	ExternalIPs               [2]uint8
	Ingress                   [2]ingressRec
	ETP, ITP, HCNP            uint8
	Affinity, Timeout         uint8
	SourceRanges              [3]uint8
}

type portRec struct{ Name, Proto, Port, NodePort uint8 }

type ingressRec struct{ IP, Mode uint8 }

type sliceRec struct {
	NS, Service, Name, AddressType uint8
	NPorts                         uint8
	Ports                          [3]slicePortRec
	NEndpoints                     uint8
	Endpoints                      [4]epRec
	Bulk                           uint8
}

type slicePortRec struct{ Name, Proto, Port uint8 }

type epRec struct {
	NAddrs            uint8
	Addrs             [2]uint8
	Conds             uint8 // ready, serving, terminating: base-3 digits nil/true/false
	Node, Zone, Hints uint8
}

type indexRec struct{ Index uint8 }

// Pools of values. Index 0 is the most ordinary choice where one exists, so that a
// zero-padded record is a plain object.
var (
	long63 = strings.Repeat("n", 63) // longest namespace and service name the API allows
	long15 = strings.Repeat("p", 15) // longest port name

	namespaces = []string{"default", "kube-system", "", long63, "x"}
	names      = []string{"a", "b", "web", "", strings.Repeat("s", 63), "dns"}
	portNames  = []string{"", "http", "dns", "https", long15, "HTTP"}
	protocols  = []v1.Protocol{v1.ProtocolTCP, "", v1.ProtocolUDP, v1.ProtocolSCTP, "ICMP", "tcp"}
	ports      = []int32{80, 0, 53, 443, 1, 65535, 65536, -1, 8080, 30080}
	nodePorts  = []int32{0, 30080, 30443, 65535, 70000, -1, 80, 30053}
	svcTypes   = []v1.ServiceType{v1.ServiceTypeClusterIP, v1.ServiceTypeNodePort, v1.ServiceTypeLoadBalancer, v1.ServiceTypeExternalName, ""}
	// Service addresses: cluster, external and load-balancer IPs, valid or not.
	serviceIPs = []string{"", "10.96.0.1", "10.96.0.2", "fd00:96::1", "fd00:96::2", "::ffff:10.96.0.1",
		"None", "not-an-ip", "10.96.0.1 ", "0.0.0.0", "::", "192.0.2.10", "2001:db8::10", "203.0.113.7",
		"198.51.100.1", "2001:db8:1::7", "127.0.0.1", "::1", "224.0.0.1", "255.255.255.255", "10.244.1.2",
		"fe80::1%eth0", "010.96.0.1", "10.96.0.1/32", "fd00:96::1%x"}
	etps          = []v1.ServiceExternalTrafficPolicy{"", v1.ServiceExternalTrafficPolicyCluster, v1.ServiceExternalTrafficPolicyLocal}
	itps          = []v1.ServiceInternalTrafficPolicy{"", v1.ServiceInternalTrafficPolicyCluster, v1.ServiceInternalTrafficPolicyLocal} // "": nil
	hcNodePorts   = []int32{0, 32000, -1, 70000, 30080}
	affinities    = []string{"", "None", "ClientIP", "ClientIP/no-clientIP", "ClientIP/timeout", "ClientIP/nil-timeout"}
	timeouts      = []int32{10800, 0, -5, 1, 86400, 86401, math.MaxInt32, math.MinInt32}
	sourceRanges  = []string{"", "10.0.0.0/8", "garbage", " 192.168.0.0/16 ", "0.0.0.0/0", "::/0", "2001:db8::/32", "10.0.0.1/33", "1.2.3.4", "192.0.2.0/24", "10.1.2.3/8"}
	ingressModes  = []string{"", "VIP", "Proxy"} // "": nil
	addressTypes  = []discovery.AddressType{discovery.AddressTypeIPv4, discovery.AddressTypeIPv6, discovery.AddressTypeFQDN, ""}
	sliceServices = []string{"a", "b", "web", "", strings.Repeat("s", 63), "dns", "<no label>", "missing"}
	sliceNames    = []string{"s1", "s2", "s3", "", "s4"}
	slicePortName = []string{"<nil>", "", "http", "dns", "https", long15, "HTTP"}
	sliceProtos   = []v1.Protocol{"<nil>", v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP, "ICMP"}
	slicePorts    = []int32{8080, 0, 53, 65535, 70000, -1, 80, math.MinInt32} // MinInt32: nil
	endpointIPs   = []string{"10.244.1.2", "10.244.1.3", "10.244.2.2", "fd00:244::2", "fd00:244::3", "::ffff:10.244.1.2",
		"not-an-ip", "", "192.0.2.10", "0.0.0.0", "::", "10.96.0.1", "2001:db8::10", "fe80::1%eth0", "127.0.0.1", "fd00:244::2%x"}
	nodeNames   = []string{"<nil>", "node-1", "node-2", ""}
	zones       = []string{"<nil>", "z1", "z2", ""}
	hintsKinds  = []string{"", "z1", "z2", "node-1", "node-2", "node-1+z1", "empty"}
	myNodeNames = []string{"node-1", "node-2", ""}
	nodeAddrTyp = []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP, v1.NodeHostName}
	nodeIPs     = []string{"192.0.2.10", "2001:db8::10", "::ffff:192.0.2.11", "garbage", "", "10.0.0.5", "fe80::1", "192.0.2.12"}
	nodeZones   = []string{"<none>", "z1", "z2", ""}
	bulkCounts  = []int{0, 0, 0, 1, 16, 17, 256, 300}

	clusterCIDRSets  = [][]netip.Prefix{nil, pfx("10.244.0.0/16"), pfx("fd00:244::/56"), pfx("10.244.0.0/16", "fd00:244::/56"), pfx("0.0.0.0/0")}
	nodePortAddrSets = [][]string{nil, {"primary"}, {"0.0.0.0/0"}, {"::/0"}, {"0.0.0.0/0", "::/0"}, {"192.0.2.0/24", "2001:db8::/64"}, {"localhost", "192.0.2.0/24"}, {"10.0.0.0/8"}}
	serviceCIDRSets  = [][]netip.Prefix{nil, pfx("10.96.0.0/16"), pfx("10.96.0.0/16", "fd00:96::/112"), pfx("fd00:96::/112"), pfx("10.96.0.1/32")}
	// localAddrs are the machine's addresses --nodeport-addresses CIDRs select from.
	localAddrs = []netip.Addr{netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("10.0.0.5"),
		netip.MustParseAddr("2001:db8::10"), netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")}
)

func pfx(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

func pick[T any](pool []T, b uint8) T { return pool[int(b)%len(pool)] }

func ptr[T any](v T) *T { return &v }

// zeroPad reads its bytes, then zeros forever.
type zeroPad struct{ b []byte }

func (z *zeroPad) Read(p []byte) (int, error) {
	n := copy(p, z.b)
	z.b = z.b[n:]
	clear(p[n:])
	return len(p), nil
}

func (z *zeroPad) read(v any) {
	_ = binary.Read(z, binary.LittleEndian, v) // cannot fail: every field is a byte
}

// world is the cluster state at one sync: what the listers would return.
type world struct {
	cfg    controller.Config
	svcs   []*v1.Service
	slices []*discovery.EndpointSlice
	node   *v1.Node
}

// decode turns fuzz bytes into the states at each sync operation, the last one being
// the state after all operations.
func decode(data []byte) []world {
	z := &zeroPad{b: data}
	var h header
	z.read(&h)
	cur := world{cfg: config(h), node: node(h.Node)}
	var out []world
	snapshot := func() {
		out = append(out, world{cfg: cur.cfg, node: cur.node,
			svcs: append([]*v1.Service(nil), cur.svcs...), slices: append([]*discovery.EndpointSlice(nil), cur.slices...)})
	}
	for ops := 0; len(z.b) > 0 && ops < maxOps; ops++ {
		var kind uint8
		z.read(&kind)
		switch kind % opKinds {
		case opService:
			var r svcRec
			z.read(&r)
			cur.svcs = upsert(cur.svcs, service(r), maxServices)
		case opSlice:
			var r sliceRec
			z.read(&r)
			cur.slices = upsert(cur.slices, slice(r), maxSlices)
		case opDeleteService:
			var r indexRec
			z.read(&r)
			cur.svcs = remove(cur.svcs, r.Index)
		case opDeleteSlice:
			var r indexRec
			z.read(&r)
			cur.slices = remove(cur.slices, r.Index)
		case opSync:
			if len(out) < maxSyncs-1 {
				snapshot()
			}
		case opNode:
			var r nodeRec
			z.read(&r)
			cur.node = node(r)
		}
	}
	snapshot()
	return out
}

type object interface {
	GetNamespace() string
	GetName() string
}

// upsert replaces the object with the same namespace and name, or appends it.
func upsert[T object](list []T, o T, limit int) []T {
	for i, x := range list {
		if x.GetNamespace() == o.GetNamespace() && x.GetName() == o.GetName() {
			list = append([]T(nil), list...)
			list[i] = o
			return list
		}
	}
	if len(list) >= limit {
		return list
	}
	return append(list, o)
}

func remove[T any](list []T, i uint8) []T {
	if len(list) == 0 {
		return list
	}
	k := int(i) % len(list)
	return append(append([]T(nil), list[:k]...), list[k+1:]...)
}

// parseNodePorts parses a --nodeport-addresses list of the pool (all valid).
func parseNodePorts(list []string) proxyconfig.NodePortAddresses {
	n, err := proxyconfig.ParseNodePortAddresses("--nodeport-addresses", list)
	if err != nil {
		panic(err)
	}
	return n
}

func config(h header) controller.Config {
	cfg := controller.Config{
		NodeName: "node-1",
		Pipeline: pipeline.Config{
			Compile: compile.Config{
				MasqueradeAll: h.Flags&1 != 0,
				MasqueradeBit: uint32(h.MasqBit % 32),
				DetectLocal:   compile.DetectLocal{Mode: compile.LocalClusterCIDR, ClusterCIDRs: pick(clusterCIDRSets, h.ClusterCIDRs)},
			},
			NodePortAddresses: parseNodePorts(pick(nodePortAddrSets, h.NodePortAddrs)),
			ServiceCIDRs:      pick(serviceCIDRSets, h.ServiceCIDRs),
			LocalAddrs:        func() ([]netip.Addr, error) { return localAddrs, nil },
		},
	}
	if h.Flags&2 != 0 {
		cfg.Pipeline.Compile.MasqueradeBit = 14 // kube-proxy's default
	}
	return cfg
}

func node(r nodeRec) *v1.Node {
	if r.Present%5 == 0 {
		return nil
	}
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: pick(myNodeNames, r.Name)}}
	if z := pick(nodeZones, r.Zone); z != "<none>" {
		n.Labels = map[string]string{v1.LabelTopologyZone: z}
	}
	for _, a := range r.Addrs[:int(r.Present)%5-1] {
		n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: pick(nodeAddrTyp, a.Type), Address: pick(nodeIPs, a.IP)})
	}
	return n
}

func service(r svcRec) *v1.Service {
	s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: pick(namespaces, r.NS), Name: pick(names, r.Name)}}
	s.Spec.Type = pick(svcTypes, r.Type)
	for _, i := range r.ClusterIPs {
		if i != 0 {
			s.Spec.ClusterIPs = append(s.Spec.ClusterIPs, pick(serviceIPs, i))
		}
	}
	switch {
	case r.ClusterIP != 0:
		s.Spec.ClusterIP = pick(serviceIPs, r.ClusterIP)
	case len(s.Spec.ClusterIPs) > 0:
		s.Spec.ClusterIP = s.Spec.ClusterIPs[0]
	}
	for _, p := range r.Ports[:int(r.NPorts)%(len(r.Ports)+1)] {
		s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{
			Name: pick(portNames, p.Name), Protocol: pick(protocols, p.Proto),
			Port: pick(ports, p.Port), NodePort: pick(nodePorts, p.NodePort),
		})
	}
	for _, i := range r.ExternalIPs {
		if i != 0 {
			s.Spec.ExternalIPs = append(s.Spec.ExternalIPs, pick(serviceIPs, i))
		}
	}
	for _, in := range r.Ingress {
		if in.IP == 0 && in.Mode == 0 {
			continue
		}
		ing := v1.LoadBalancerIngress{IP: pick(serviceIPs, in.IP)}
		if m := pick(ingressModes, in.Mode); m != "" {
			ing.IPMode = ptr(v1.LoadBalancerIPMode(m))
		}
		s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, ing)
	}
	s.Spec.ExternalTrafficPolicy = pick(etps, r.ETP)
	if p := pick(itps, r.ITP); p != "" {
		s.Spec.InternalTrafficPolicy = ptr(p)
	}
	s.Spec.HealthCheckNodePort = pick(hcNodePorts, r.HCNP)
	switch a := pick(affinities, r.Affinity); a {
	case "", "None":
		s.Spec.SessionAffinity = v1.ServiceAffinity(a)
	default:
		s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		switch a {
		case "ClientIP/no-clientIP":
			s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{}
		case "ClientIP/timeout":
			s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr(pick(timeouts, r.Timeout))}}
		case "ClientIP/nil-timeout":
			s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{}}
		}
	}
	for _, i := range r.SourceRanges {
		if i != 0 {
			s.Spec.LoadBalancerSourceRanges = append(s.Spec.LoadBalancerSourceRanges, pick(sourceRanges, i))
		}
	}
	return s
}

func slice(r sliceRec) *discovery.EndpointSlice {
	s := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: pick(namespaces, r.NS), Name: pick(sliceNames, r.Name)},
		AddressType: pick(addressTypes, r.AddressType),
	}
	switch svc := pick(sliceServices, r.Service); svc {
	case "<no label>":
	case "missing":
		s.Labels = map[string]string{discovery.LabelServiceName: "no-such-service"}
	default:
		s.Labels = map[string]string{discovery.LabelServiceName: svc}
	}
	for _, p := range r.Ports[:int(r.NPorts)%(len(r.Ports)+1)] {
		var sp discovery.EndpointPort
		if n := pick(slicePortName, p.Name); n != "<nil>" {
			sp.Name = ptr(n)
		}
		if pr := pick(sliceProtos, p.Proto); pr != "<nil>" {
			sp.Protocol = ptr(pr)
		}
		if n := pick(slicePorts, p.Port); n != math.MinInt32 {
			sp.Port = ptr(n)
		}
		s.Ports = append(s.Ports, sp)
	}
	for _, e := range r.Endpoints[:int(r.NEndpoints)%(len(r.Endpoints)+1)] {
		ep := discovery.Endpoint{Conditions: conditions(e.Conds)}
		for _, a := range e.Addrs[:int(e.NAddrs)%(len(e.Addrs)+1)] {
			ep.Addresses = append(ep.Addresses, pick(endpointIPs, a))
		}
		if n := pick(nodeNames, e.Node); n != "<nil>" {
			ep.NodeName = ptr(n)
		}
		if z := pick(zones, e.Zone); z != "<nil>" {
			ep.Zone = ptr(z)
		}
		ep.Hints = hints(pick(hintsKinds, e.Hints))
		s.Endpoints = append(s.Endpoints, ep)
	}
	// Bulk endpoints: many distinct addresses of the slice's family (or IPv4 for the
	// others), with conditions and nodes varying by index.
	n := pick(bulkCounts, r.Bulk)
	for i := range n {
		addr := fmt.Sprintf("10.245.%d.%d", i/250, i%250+1)
		if s.AddressType == discovery.AddressTypeIPv6 {
			addr = fmt.Sprintf("fd00:245::%x", i+1)
		}
		ep := discovery.Endpoint{Addresses: []string{addr}, Conditions: conditions(uint8(i) * (r.Bulk >> 3))}
		if i%2 == 0 {
			ep.NodeName = ptr("node-1")
		}
		s.Endpoints = append(s.Endpoints, ep)
	}
	return s
}

// conditions decodes three base-3 digits: nil, true or false for ready, serving and
// terminating.
func conditions(b uint8) discovery.EndpointConditions {
	tri := func(d uint8) *bool {
		switch d % 3 {
		case 1:
			return ptr(true)
		case 2:
			return ptr(false)
		}
		return nil
	}
	return discovery.EndpointConditions{Ready: tri(b), Serving: tri(b / 3), Terminating: tri(b / 9)}
}

func hints(kind string) *discovery.EndpointHints {
	switch kind {
	case "":
		return nil
	case "empty":
		return &discovery.EndpointHints{}
	case "node-1", "node-2":
		return &discovery.EndpointHints{ForNodes: []discovery.ForNode{{Name: kind}}}
	case "node-1+z1":
		return &discovery.EndpointHints{ForNodes: []discovery.ForNode{{Name: "node-1"}}, ForZones: []discovery.ForZone{{Name: "z1"}}}
	}
	return &discovery.EndpointHints{ForZones: []discovery.ForZone{{Name: kind}}}
}

// encoder writes inputs in the format decode reads, for the seed corpus.
type encoder struct{ bytes.Buffer }

func (e *encoder) write(v any) *encoder {
	if err := binary.Write(&e.Buffer, binary.LittleEndian, v); err != nil {
		panic(err)
	}
	return e
}

func (e *encoder) op(kind uint8, rec any) *encoder {
	e.write(kind)
	if rec != nil {
		e.write(rec)
	}
	return e
}

// at returns the index of v in pool, for writing seeds by value; it panics when v is
// not in the pool.
func at[T comparable](pool []T, v T) uint8 {
	for i, x := range pool {
		if x == v {
			return uint8(i)
		}
	}
	panic(fmt.Sprintf("%v is not in the pool", v))
}
