package controller_test

// The isolation invariant: whatever a second namespace adds or changes, the first
// namespace's traffic keeps leading to exactly its endpoints, on every node: its
// cluster IPs, its node port on each node's own address, and its pods' addresses (a
// packet a pod's node receives for the pod, after another node DNATed it to that
// endpoint or straight from a client). FuzzIsolation takes the fuzz input format of
// fuzz_input_test.go as the tenant's objects, moves them into the tenant's namespace
// (namespaced write is all a tenant has), and compares the victim's compiled mapping on
// two nodes (each with its own address and podCIDR, the victim's pods on both) with
// the one compiled without the tenant, at every sync and through both the fresh and
// the incremental compiler.

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/internal/admit"
	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/controller"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/pipeline"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/trace"
)

const (
	victimNS = "victim"
	tenantNS = "tenant"
)

var victimCreated = metav1.NewTime(time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC))

// victim returns the first namespace's objects: a dual-stack web service with an
// externalIP and a node port, whose cluster IPs are in the fuzz pools (so that the
// tenant's objects collide with them; the pools' other cluster IPs, 10.96.0.2 and
// fd00:96::2, stay free for the tenant), and a DNS service.
func victim() ([]*v1.Service, []*discovery.EndpointSlice) {
	meta := func(name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Namespace: victimNS, Name: name, CreationTimestamp: victimCreated}
	}
	web := &v1.Service{ObjectMeta: meta("web"), Spec: v1.ServiceSpec{
		Type: v1.ServiceTypeNodePort, ClusterIP: "10.96.0.1", ClusterIPs: []string{"10.96.0.1", "fd00:96::1"},
		Ports: []v1.ServicePort{
			{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, NodePort: 30080},
			{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53},
		},
		ExternalIPs: []string{"203.0.113.7"},
	}}
	dns := &v1.Service{ObjectMeta: meta("dns"), Spec: v1.ServiceSpec{
		ClusterIP: "10.96.0.53", ClusterIPs: []string{"10.96.0.53"},
		Ports: []v1.ServicePort{{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53}, {Name: "dns-tcp", Protocol: v1.ProtocolTCP, Port: 53}},
	}}
	slice := func(name, svc string, typ discovery.AddressType, ports []discovery.EndpointPort, addrs ...string) *discovery.EndpointSlice {
		s := &discovery.EndpointSlice{ObjectMeta: meta(name), AddressType: typ, Ports: ports}
		s.Labels = map[string]string{discovery.LabelServiceName: svc}
		for _, a := range addrs {
			s.Endpoints = append(s.Endpoints, discovery.Endpoint{Addresses: []string{a}, NodeName: ptr(podNode(netip.MustParseAddr(a)))})
		}
		return s
	}
	port := func(name string, proto v1.Protocol, n int32) discovery.EndpointPort {
		return discovery.EndpointPort{Name: ptr(name), Protocol: ptr(proto), Port: ptr(n)}
	}
	webPorts := []discovery.EndpointPort{port("http", v1.ProtocolTCP, 8080), port("dns", v1.ProtocolUDP, 5353)}
	return []*v1.Service{web, dns}, []*discovery.EndpointSlice{
		slice("web-v4", "web", discovery.AddressTypeIPv4, webPorts, "10.244.1.2", "10.244.2.2"),
		slice("web-v6", "web", discovery.AddressTypeIPv6, webPorts, "fd00:244::2"),
		slice("dns-v4", "dns", discovery.AddressTypeIPv4,
			[]discovery.EndpointPort{port("dns", v1.ProtocolUDP, 53), port("dns-tcp", v1.ProtocolTCP, 53)}, "10.244.1.3"),
	}
}

// isolationNodes are the two nodes: name, addresses, podCIDRs.
var isolationNodes = []struct {
	name     string
	addrs    []string
	podCIDRs []string
}{
	{"node-1", []string{"192.0.2.10", "2001:db8::10"}, []string{"10.244.1.0/24", "fd00:244::/64"}},
	{"node-2", []string{"192.0.2.11", "2001:db8::11"}, []string{"10.244.2.0/24", "fd00:244:0:1::/64"}},
}

// podNode is the node whose podCIDR holds a victim pod's address.
func podNode(a netip.Addr) string {
	for _, n := range isolationNodes {
		for _, c := range n.podCIDRs {
			if netip.MustParsePrefix(c).Contains(a) {
				return n.name
			}
		}
	}
	return ""
}

// isolationConfig is node-1's configuration: fixed, since a tenant cannot change it.
// The limits are small so that inputs reach them. No --cluster-cidr reaches the
// refusals (ClusterCIDRs), so that a pod on the other node is protected by what every
// node sees (its endpoints), not by a range.
func isolationConfig() controller.Config {
	return controller.Config{
		NodeName: "node-1",
		Pipeline: pipeline.Config{
			Compile: compile.Config{
				MasqueradeBit: 14,
				DetectLocal:   compile.DetectLocal{Mode: compile.LocalClusterCIDR, ClusterCIDRs: pfx("10.244.0.0/16", "fd00:244::/56")},
				Policy: admit.Policy{
					ServedPorts: []uint16{10256, 10249},
					Limits:      admit.Limits{MaxFrontendsPerService: 12, MaxEndpointsPerServicePort: 64, MaxElements: 2000},
				},
			},
			ServiceCIDRs:      pfx("10.96.0.0/16", "fd00:96::/112"),
			NodePortAddresses: parseNodePorts([]string{"all"}),
			LocalAddrs:        func() ([]netip.Addr, error) { return localAddrs, nil },
		},
	}
}

func isolationNode() *v1.Node { return isolationNodeN(0) }

// isolationNodeN is the Node object of isolationNodes[i].
func isolationNodeN(i int) *v1.Node {
	in := isolationNodes[i]
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: in.name}}
	for _, a := range in.addrs {
		n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeInternalIP, Address: a})
	}
	n.Spec.PodCIDRs = in.podCIDRs
	return n
}

// isolationConfigN is node i's configuration: node-1's with the node's name and
// addresses.
func isolationConfigN(i int) controller.Config {
	cfg := isolationConfig()
	cfg.NodeName = isolationNodes[i].name
	var local []netip.Addr
	for _, a := range isolationNodes[i].addrs {
		local = append(local, netip.MustParseAddr(a))
	}
	local = append(local, netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1"))
	cfg.Pipeline.LocalAddrs = func() ([]netip.Addr, error) { return local, nil }
	return cfg
}

// probe is a new connection the isolation check traces.
type probe struct {
	saddr, daddr netip.Addr
	proto        uint8
	port         uint16
}

// victimProbes are the connections whose fate the tenant must not change on node i,
// for the victim's objects: from a pod on the node to every victim cluster IP on each
// victim port; from a pod on the other node to every victim endpoint (address,
// protocol, port: what the pod's node receives once the other node DNATed a cluster IP
// connection to it); and from a client outside to the victim's node ports on the
// node's own addresses.
func victimProbes(i int, svcs []*v1.Service, eps []*discovery.EndpointSlice, victimIPs map[netip.Addr]bool) []probe {
	pod := func(node int, v6 bool) netip.Addr {
		p := netip.MustParsePrefix(isolationNodes[node].podCIDRs[map[bool]int{false: 0, true: 1}[v6]])
		a := p.Addr().As16()
		a[15] = 9
		if v6 {
			return netip.AddrFrom16(a)
		}
		return netip.AddrFrom16(a).Unmap()
	}
	client := map[bool]netip.Addr{false: netip.MustParseAddr("198.51.100.99"), true: netip.MustParseAddr("2001:db8:99::9")}
	var out []probe
	for ip := range victimIPs {
		for _, p := range []struct {
			proto uint8
			port  uint16
		}{{model.ProtoTCP, 80}, {model.ProtoUDP, 53}, {model.ProtoTCP, 53}} {
			out = append(out, probe{pod(i, ip.Is6()), ip, p.proto, p.port})
		}
	}
	for _, s := range eps {
		for _, e := range s.Endpoints {
			a := netip.MustParseAddr(e.Addresses[0])
			for _, p := range s.Ports {
				proto, _ := map[v1.Protocol]uint8{v1.ProtocolTCP: model.ProtoTCP, v1.ProtocolUDP: model.ProtoUDP}[*p.Protocol]
				out = append(out, probe{pod(1-i, a.Is6()), a, proto, uint16(*p.Port)})
			}
		}
	}
	for _, s := range svcs {
		for _, p := range s.Spec.Ports {
			if p.NodePort == 0 {
				continue
			}
			for _, a := range isolationNodes[i].addrs {
				ip := netip.MustParseAddr(a)
				out = append(out, probe{client[ip.Is6()], ip, map[v1.Protocol]uint8{v1.ProtocolTCP: model.ProtoTCP, v1.ProtocolUDP: model.ProtoUDP}[p.Protocol], uint16(p.NodePort)})
			}
		}
	}
	return out
}

// tenantObjects moves a fuzz world's Services and slices into the tenant's namespace,
// created after the victim's (the tenant arrives later; creation time is set by the
// API server), and drops Services the API could not hold: one whose cluster IP is
// already allocated to the victim, or outside the service CIDRs (the allocator hands out
// nothing else; FuzzIsolation found that a tenant cluster IP equal to the victim's pod
// IP takes that endpoint away from the victim, which the API never allows).
func tenantObjects(w world, victimIPs map[netip.Addr]bool) ([]*v1.Service, []*discovery.EndpointSlice) {
	serviceCIDRs := isolationConfig().Pipeline.ServiceCIDRs
	created := metav1.NewTime(victimCreated.Add(time.Hour))
	var svcs []*v1.Service
	seen := map[string]bool{}
	for _, s := range w.svcs {
		s = s.DeepCopy()
		s.Namespace, s.CreationTimestamp = tenantNS, created
		if seen[s.Name] {
			continue // moved into one namespace, two objects would share a key
		}
		taken := false
		for _, a := range append(slices.Clone(s.Spec.ClusterIPs), s.Spec.ClusterIP) {
			ip, err := netip.ParseAddr(a)
			if err != nil {
				continue // garbage: the model reports and skips it
			}
			ip = ip.Unmap()
			if victimIPs[ip] || !slices.ContainsFunc(serviceCIDRs, func(p netip.Prefix) bool { return p.Contains(ip) }) {
				taken = true
			}
		}
		if taken {
			continue
		}
		seen[s.Name] = true
		if len(svcs)%2 == 0 { // every other tenant Service asks for consistent hashing
			if s.Annotations == nil {
				s.Annotations = map[string]string{}
			}
			s.Annotations[model.LoadBalancingAnnotation] = "maglev"
		}
		svcs = append(svcs, s)
	}
	var out []*discovery.EndpointSlice
	seenSlice := map[string]bool{}
	for _, s := range w.slices {
		s = s.DeepCopy()
		s.Namespace, s.CreationTimestamp = tenantNS, created
		if seenSlice[s.Name] {
			continue
		}
		seenSlice[s.Name] = true
		out = append(out, s)
	}
	return svcs, out
}

// victimMapping describes, for every victim cluster IP, every element of the ruleset
// keyed by it and, for service-ips verdicts, the endpoints the target chain picks from;
// and, whatever the shape (a chain of its own or the flat path's shared chains), where
// each probe (victimProbes) goes, traced on a node whose own addresses are local.
func victimMapping(rs *nft.Ruleset, victimIPs map[netip.Addr]bool, probes []probe, local []netip.Addr) string {
	return victimElements(rs, victimIPs) + "\n" + victimTraces(rs, probes, local)
}

// victimTraces traces the probes of the ruleset's family and lists the outcomes with
// their probabilities.
func victimTraces(rs *nft.Ruleset, probes []probe, local []netip.Addr) string {
	ctx := trace.Context{IsLocal: func(a netip.Addr) bool { return slices.Contains(local, a) }}
	var lines []string
	for _, pr := range probes {
		if pr.daddr.Is6() != (rs.Family == nft.IPv6) {
			continue
		}
		what := fmt.Sprintf("trace %s → %s %d/%d", pr.saddr, pr.daddr, pr.port, pr.proto)
		pkt := trace.Packet{Family: rs.Family, Saddr: pr.saddr, Daddr: pr.daddr, L4Proto: pr.proto, Dport: pr.port, Hook: nft.Prerouting}
		res, err := trace.Trace(rs, pkt, ctx)
		if err != nil {
			lines = append(lines, fmt.Sprintf("%s: %v", what, err))
			continue
		}
		probs := map[string]float64{}
		for _, o := range res.Outcomes {
			k := o.Verdict.String()
			if o.DNAT.IsValid() {
				k += " " + o.DNAT.String()
			}
			if o.Masquerade {
				k += " masquerade"
			}
			probs[k] += o.Probability
		}
		var out []string
		for k, p := range probs {
			out = append(out, fmt.Sprintf("%s %.6f", k, p))
		}
		sort.Strings(out)
		lines = append(lines, fmt.Sprintf("%s: %s", what, strings.Join(out, ", ")))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// victimElements lists the elements keyed by a victim cluster IP.
func victimElements(rs *nft.Ruleset, victimIPs map[netip.Addr]bool) string {
	chains := map[string]*nft.Chain{}
	for _, c := range rs.Chains {
		chains[c.Name] = c
	}
	sets := map[string]*nft.Set{}
	for _, s := range rs.Sets {
		sets[s.Name] = s
	}
	var lines []string
	for _, s := range rs.Sets {
		for _, e := range s.Elements {
			if len(e.Key) == 0 || !victimIPs[e.Key[0].Addr()] {
				continue
			}
			line := s.Name + " " + describeElement(s, e)
			if e.Verdict != nil && e.Verdict.Chain != "" {
				line += " → " + chainEndpoints(chains, sets, e.Verdict.Chain)
			}
			lines = append(lines, line)
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// chainEndpoints lists the endpoints a service chain DNATs to.
func chainEndpoints(chains map[string]*nft.Chain, sets map[string]*nft.Set, name string) string {
	ch := chains[name]
	if ch == nil {
		return "(missing chain " + name + ")"
	}
	var out []string
	for _, r := range ch.Rules {
		for _, st := range r.Stmts {
			switch d := st.(type) {
			case nft.DNATNumgenMap:
				out = append(out, slotEndpoints(sets[d.Map], d))
			case nft.DNATTo:
				out = append(out, netip.AddrPortFrom(d.Addr, d.Port).String())
			case nft.Verdict:
				if (d.Kind == nft.Goto || d.Kind == nft.Jump) && d.Chain != "mark-for-masquerade" {
					out = append(out, chainEndpoints(chains, sets, d.Chain))
				}
			}
		}
	}
	return "[" + strings.Join(out, " ") + "]"
}

// ownPortsTaken lists frontend elements (chained: service-ips; flat: cluster- and
// external-frontends; without endpoints: the no-endpoint sets) that would answer on the
// node's addresses on the ports nftproxy serves.
func ownPortsTaken(rs *nft.Ruleset, cfg controller.Config, node *v1.Node) []string {
	own := map[netip.Addr]bool{}
	for _, a := range node.Status.Addresses {
		own[netip.MustParseAddr(a.Address)] = true
	}
	var out []string
	for _, s := range rs.Sets {
		if !slices.Contains([]string{"service-ips", "cluster-frontends", "external-frontends", "no-endpoint-services", "no-local-endpoint-services"}, s.Name) {
			continue
		}
		for _, e := range s.Elements {
			if len(e.Key) == 3 && own[e.Key[0].Addr()] && e.Key[1].Num() == uint32(model.ProtoTCP) && slices.Contains(cfg.Pipeline.Compile.ServedPorts, uint16(e.Key[2].Num())) {
				out = append(out, s.Name+" "+describeElement(s, e))
			}
		}
	}
	return out
}

func FuzzIsolation(f *testing.F) {
	for _, data := range seeds() {
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) { checkIsolation(t, data) })
}

// checkIsolation runs FuzzIsolation's check of one input.
func checkIsolation(t *testing.T, data []byte) {
	vsvcs, vslices := victim()
	victimIPs := map[netip.Addr]bool{}
	for _, s := range vsvcs {
		for _, a := range s.Spec.ClusterIPs {
			victimIPs[netip.MustParseAddr(a)] = true
		}
	}
	type nodeState struct {
		cfg       controller.Config
		node      *v1.Node
		local     []netip.Addr
		probes    []probe
		want      []string
		slots     map[nft.Family]*compile.Slots
		cache     *model.Cache
		compilers map[nft.Family]*compile.Compiler
	}
	nodes := make([]*nodeState, len(isolationNodes))
	for n := range nodes {
		ns := &nodeState{cfg: isolationConfigN(n), node: isolationNodeN(n), slots: map[nft.Family]*compile.Slots{},
			cache: model.NewCache(), compilers: map[nft.Family]*compile.Compiler{}}
		ns.local, _ = ns.cfg.Pipeline.LocalAddrs()
		ns.probes = victimProbes(n, vsvcs, vslices, victimIPs)
		_, alone, _, err := pipeline.Compile(ns.cfg.Pipeline, map[nft.Family]*compile.Slots{}, vsvcs, vslices, ns.node)
		if err != nil {
			t.Fatal(err)
		}
		for _, rs := range alone {
			want := victimMapping(rs, victimIPs, ns.probes, ns.local)
			if !strings.Contains(want, "10.244.") && !strings.Contains(want, "fd00:244::") {
				t.Fatalf("the victim alone has no endpoints in %s:\n%s", rs.Family, want)
			}
			if !strings.Contains(want, "accept 10.244.") && !strings.Contains(want, "accept [fd00:244::") {
				t.Fatalf("the victim alone: no traced connection reaches an endpoint in %s:\n%s", rs.Family, want)
			}
			ns.want = append(ns.want, want)
		}
		nodes[n] = ns
	}
	for step, w := range decode(data) {
		tsvcs, tslices := tenantObjects(w, victimIPs)
		svcs, eps := slices.Concat(vsvcs, tsvcs), slices.Concat(vslices, tslices)
		for _, ns := range nodes {
			cfg, node := ns.cfg, ns.node
			snap, rulesets, _, err := pipeline.Compile(cfg.Pipeline, ns.slots, svcs, eps, node)
			if err != nil {
				t.Fatal(err)
			}
			// the incremental path: the model cache and one compiler per family
			isnap, _ := ns.cache.BuildFrom(model.Inputs{Services: svcs, Slices: eps, Node: node, ServiceCIDRs: cfg.Pipeline.ServiceCIDRs})
			for i, rs := range rulesets {
				what := fmt.Sprintf("sync %d, %s, %s", step, node.Name, rs.Family)
				if got := victimMapping(rs, victimIPs, ns.probes, ns.local); got != ns.want[i] {
					t.Fatalf("%s: the tenant moved the victim's traffic\n%s\n%s", what, describeTenant(tsvcs, tslices), "--- victim alone (-) vs with the tenant (+):"+strings.TrimPrefix(diffLines(ns.want[i], got), "--- fresh (-) vs incremental (+):"))
				}
				if taken := ownPortsTaken(rs, cfg, node); len(taken) > 0 {
					t.Fatalf("%s: a service answers on the node's own served ports: %v\n%s", what, taken, describeTenant(tsvcs, tslices))
				}
				fam := rs.Family
				if ns.compilers[fam] == nil {
					ns.compilers[fam] = compile.NewCompiler(compileConfig(cfg, snap.Node, fam), compile.NewSlots())
				}
				inc, _ := ns.compilers[fam].Compile(isnap)
				if got := victimMapping(inc.Flatten(), victimIPs, ns.probes, ns.local); got != ns.want[i] {
					t.Fatalf("%s (incremental): the tenant moved the victim's traffic\n%s\n%s", what, describeTenant(tsvcs, tslices), "--- victim alone (-) vs with the tenant (+):"+strings.TrimPrefix(diffLines(ns.want[i], got), "--- fresh (-) vs incremental (+):"))
				}
			}
		}
	}
}

func describeTenant(svcs []*v1.Service, eps []*discovery.EndpointSlice) string {
	var b strings.Builder
	for _, s := range svcs {
		fmt.Fprintf(&b, "Service %s: type %s clusterIPs %q/%q ports %v externalIPs %q ingress %v\n",
			s.Name, s.Spec.Type, s.Spec.ClusterIP, s.Spec.ClusterIPs, s.Spec.Ports, s.Spec.ExternalIPs, s.Status.LoadBalancer.Ingress)
	}
	for _, s := range eps {
		var addrs []string
		for _, e := range s.Endpoints {
			addrs = append(addrs, e.Addresses...)
		}
		fmt.Fprintf(&b, "EndpointSlice %s: service %q type %s endpoints %q\n", s.Name, s.Labels[discovery.LabelServiceName], s.AddressType, addrs)
	}
	return b.String()
}

// isolationSeeds are tenant inputs that try each hostile move of docs/security.md against the
// victim (whatever namespace they name, they land in the tenant's).
func isolationSeeds() map[string][]byte {
	h := stdHeader()
	lb := v1.ServiceTypeLoadBalancer
	return map[string][]byte{
		"externalip-on-victim-clusterip": seed(h,
			addSvc(svc("x", "a", v1.ServiceTypeClusterIP, "10.96.0.2").port("http", v1.ProtocolTCP, 80, 0).port("https", v1.ProtocolTCP, 443, 0).external("10.96.0.1")),
			addSlice(sl("x", "a", "s1", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 8080).ep(ready, "10.244.2.2"))),
		"lb-ip-on-victim-clusterip": seed(h,
			addSvc(svc("x", "a", lb, "fd00:96::2").port("dns", v1.ProtocolUDP, 53, 30053).port("https", v1.ProtocolTCP, 443, 0).ingress("VIP", "10.96.0.1", "fd00:96::1")),
			addSlice(sl("x", "a", "s1", discovery.AddressTypeIPv4).port("dns", v1.ProtocolUDP, 53).ep(ready, "10.244.2.2"))),
		"clusterip-taken-is-refused-by-the-api": seed(h,
			addSvc(svc("x", "a", v1.ServiceTypeClusterIP, "10.96.0.1").port("http", v1.ProtocolTCP, 80, 0))),
		"endpoints-at-victim-clusterip-and-loopback": seed(h,
			addSvc(svc("x", "web", v1.ServiceTypeNodePort, "10.96.0.2").port("http", v1.ProtocolTCP, 80, 30080)),
			addSlice(sl("x", "web", "s1", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 80).ep(ready, "10.96.0.1").ep(ready, "127.0.0.1").ep(ready, "0.0.0.0"))),
		"too-many-endpoints-then-fewer": seed(h,
			addSvc(svc("x", "a", v1.ServiceTypeClusterIP, "10.96.0.2").port("http", v1.ProtocolTCP, 80, 0)),
			addSlice(sl("x", "a", "s1", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 8080).bulk(300, 1)),
			syncNow(),
			addSlice(sl("x", "a", "s1", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 8080).bulk(16, 1))),
		"externalip-node-address": seed(h,
			addSvc(svc("x", "a", v1.ServiceTypeClusterIP, "10.96.0.2").port("http", v1.ProtocolTCP, 80, 0).port("dns", v1.ProtocolUDP, 53, 0).external("192.0.2.10", "2001:db8::10")),
			addSlice(sl("x", "a", "s1", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 8080).port("dns", v1.ProtocolUDP, 53).ep(ready, "10.244.2.2"))),
		"externalip-on-victim-pod-ip": seed(h,
			addSvc(svc("x", "a", v1.ServiceTypeClusterIP, "10.96.0.2").port("http", v1.ProtocolTCP, 8080, 0).external("10.244.1.2")),
			addSlice(sl("x", "a", "s1", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 80).ep(ready, "10.244.1.3"))),
		"externalip-on-victim-pod-ip-without-endpoints": seed(h,
			addSvc(svc("x", "a", v1.ServiceTypeClusterIP, "10.96.0.2").port("http", v1.ProtocolTCP, 8080, 0).external("10.244.1.2"))),
		"externalip-node-address-at-victim-nodeport": seed(h,
			addSvc(svc("x", "a", v1.ServiceTypeClusterIP, "10.96.0.2").port("http", v1.ProtocolTCP, 30080, 0).external("192.0.2.10")),
			addSlice(sl("x", "a", "s1", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 80).ep(ready, "10.244.1.3"))),
		"victim-externalip-and-nodeport": seed(h,
			addSvc(svc("x", "b", lb, "10.96.0.2", "fd00:96::2").port("http", v1.ProtocolTCP, 80, 30080).external("203.0.113.7").ingress("", "10.96.0.1 ", "::ffff:10.96.0.1")),
			addSlice(sl("x", "b", "s1", discovery.AddressTypeIPv4).port("http", v1.ProtocolTCP, 8080).ep(ready, "10.244.1.2"))),
	}
}

// TestFuzzIsolationCorpus keeps testdata/fuzz/FuzzIsolation in step with isolationSeeds
// (rewrite with -update-fuzz-seeds).
func TestFuzzIsolationCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzIsolation")
	for name, data := range isolationSeeds() {
		path := filepath.Join(dir, "seed-"+name)
		want := corpusFile(data)
		if *updateSeeds {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s is missing or stale (%v): run go test -run TestFuzzIsolationCorpus ./internal/controller/ -update-fuzz-seeds", path, err)
		}
	}
}

// The invariant's check can fail: a tenant Service holding the victim's cluster IP (the
// API's allocator prevents it; tenantObjects drops such Services) wins it by name order,
// and victimMapping sees the victim's traffic move.
func TestIsolationCheckCatchesHijack(t *testing.T) {
	cfg, node := isolationConfig(), isolationNode()
	vsvcs, vslices := victim()
	victimIPs := map[netip.Addr]bool{netip.MustParseAddr("10.96.0.1"): true}
	_, alone, _, _ := pipeline.Compile(cfg.Pipeline, map[nft.Family]*compile.Slots{}, vsvcs, vslices, node)
	hijack := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: tenantNS, Name: "a", CreationTimestamp: victimCreated},
		Spec: v1.ServiceSpec{ClusterIP: "10.96.0.1", ClusterIPs: []string{"10.96.0.1"}, Ports: []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80}}}}
	hslice := &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: tenantNS, Name: "a-1", Labels: map[string]string{discovery.LabelServiceName: "a"}},
		AddressType: discovery.AddressTypeIPv4, Ports: []discovery.EndpointPort{{Name: ptr("http"), Protocol: ptr(v1.ProtocolTCP), Port: ptr(int32(8080))}},
		Endpoints: []discovery.Endpoint{{Addresses: []string{"10.244.66.6"}}}}
	_, with, _, _ := pipeline.Compile(cfg.Pipeline, map[nft.Family]*compile.Slots{}, append(vsvcs, hijack), append(vslices, hslice), node)
	probes, local := victimProbes(0, vsvcs, vslices, victimIPs), []netip.Addr{netip.MustParseAddr("192.0.2.10")}
	a, b := victimMapping(alone[0], victimIPs, probes, local), victimMapping(with[0], victimIPs, probes, local)
	if a == b || !strings.Contains(b, "10.244.66.6") {
		t.Errorf("victimMapping did not see the hijack:\n--- alone:\n%s\n--- with:\n%s", a, b)
	}
	if s, got := tenantObjects(world{svcs: []*v1.Service{hijack}}, victimIPs); len(s) != 0 || got != nil {
		t.Errorf("tenantObjects kept a Service holding an allocated cluster IP")
	}
}
