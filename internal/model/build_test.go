package model_test

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/nftproxy/nftproxy/internal/model"
)

// ---- object builders -------------------------------------------------------------------

type svcOpt func(*v1.Service)

// service returns a ClusterIP service in namespace "default" with the given cluster IPs
// and one TCP port "http" 80 unless opts replace the ports.
func service(name string, clusterIPs []string, opts ...svcOpt) *v1.Service {
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIPs: clusterIPs,
			Ports:      []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80}},
		},
	}
	if len(clusterIPs) > 0 {
		s.Spec.ClusterIP = clusterIPs[0]
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

func withType(t v1.ServiceType) svcOpt { return func(s *v1.Service) { s.Spec.Type = t } }

func withPorts(ps ...v1.ServicePort) svcOpt { return func(s *v1.Service) { s.Spec.Ports = ps } }

func withExternalIPs(ips ...string) svcOpt {
	return func(s *v1.Service) { s.Spec.ExternalIPs = ips }
}

func withIngress(ing ...v1.LoadBalancerIngress) svcOpt {
	return func(s *v1.Service) { s.Status.LoadBalancer.Ingress = ing }
}

func svcPort(name string, proto v1.Protocol, port, nodePort int32) v1.ServicePort {
	return v1.ServicePort{Name: name, Protocol: proto, Port: port, NodePort: nodePort}
}

// slice returns an EndpointSlice of service default/<svc>.
func slice(name, svc string, af discovery.AddressType, ports []discovery.EndpointPort, eps ...discovery.Endpoint) *discovery.EndpointSlice {
	return &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "default", Name: name,
			Labels: map[string]string{discovery.LabelServiceName: svc},
		},
		AddressType: af,
		Ports:       ports,
		Endpoints:   eps,
	}
}

func v4slice(name, svc string, ports []discovery.EndpointPort, eps ...discovery.Endpoint) *discovery.EndpointSlice {
	return slice(name, svc, discovery.AddressTypeIPv4, ports, eps...)
}

func ports(ps ...discovery.EndpointPort) []discovery.EndpointPort { return ps }

// tcp is a named TCP slice port; name "" means an unnamed port (nil name).
func tcp(name string, port int32) discovery.EndpointPort {
	p := discovery.EndpointPort{Protocol: ptr.To(v1.ProtocolTCP), Port: ptr.To(port)}
	if name != "" {
		p.Name = ptr.To(name)
	}
	return p
}

func udp(name string, port int32) discovery.EndpointPort {
	p := tcp(name, port)
	p.Protocol = ptr.To(v1.ProtocolUDP)
	return p
}

// endpoint has nil conditions (which mean ready, serving, not terminating).
func endpoint(addrs ...string) discovery.Endpoint { return discovery.Endpoint{Addresses: addrs} }

func cond(e discovery.Endpoint, ready, serving, terminating *bool) discovery.Endpoint {
	e.Conditions = discovery.EndpointConditions{Ready: ready, Serving: serving, Terminating: terminating}
	return e
}

func onNode(e discovery.Endpoint, node, zone string) discovery.Endpoint {
	e.NodeName, e.Zone = ptr.To(node), ptr.To(zone)
	return e
}

func node(labels map[string]string, addrs ...v1.NodeAddress) *v1.Node {
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", Labels: labels}, Status: v1.NodeStatus{Addresses: addrs}}
}

func internalIP(a string) v1.NodeAddress { return v1.NodeAddress{Type: v1.NodeInternalIP, Address: a} }
func externalIP(a string) v1.NodeAddress { return v1.NodeAddress{Type: v1.NodeExternalIP, Address: a} }

var yes, no = ptr.To(true), ptr.To(false)

// ---- dumps ---------------------------------------------------------------------------

// dumpPort is a one-line, readable rendering of a ServicePort:
//
//	default/web:http/TCP ips=10.96.0.1 port=80 np=30080 ext=203.0.113.1 lb=198.51.100.1 eps=10.0.0.1:8080/RS-@node-a%zone-a
//
// Endpoint flags are R(eady) S(erving) T(erminating), "-" when false.
func dumpPort(sp *model.ServicePort) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s/%s ips=%s port=%d", sp.Name, model.ProtoString(sp.Name.Protocol), addrs(sp.ClusterIPs), sp.Port)
	if sp.NodePort != 0 {
		fmt.Fprintf(&b, " np=%d", sp.NodePort)
	}
	if len(sp.ExternalIPs) > 0 {
		fmt.Fprintf(&b, " ext=%s", addrs(sp.ExternalIPs))
	}
	if len(sp.LoadBalancerIPs) > 0 {
		fmt.Fprintf(&b, " lb=%s", addrs(sp.LoadBalancerIPs))
	}
	if len(sp.Endpoints) > 0 {
		b.WriteString(" eps=")
		for i, e := range sp.Endpoints {
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString(dumpEndpoint(e))
		}
	}
	return b.String()
}

func dumpEndpoint(e model.Endpoint) string {
	flag := func(v bool, c string) string {
		if v {
			return c
		}
		return "-"
	}
	s := e.AddrPort().String() + "/" + flag(e.Ready, "R") + flag(e.Serving, "S") + flag(e.Terminating, "T")
	if e.NodeName != "" {
		s += "@" + e.NodeName
	}
	if e.Zone != "" {
		s += "%" + e.Zone
	}
	return s
}

func addrs(as []netip.Addr) string {
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.String()
	}
	return strings.Join(s, ",")
}

func dumpSnapshot(snap *model.Snapshot) []string {
	out := make([]string, len(snap.Services))
	for i, sp := range snap.Services {
		out[i] = dumpPort(sp)
	}
	return out
}

// problemMatches reports whether p is "Kind ns/name: …reason…" as written in want, where
// the reason part of want is a substring of p.Reason.
func problemMatches(p model.Problem, want string) bool {
	head, reason, _ := strings.Cut(want, ": ")
	return head == p.Kind.String()+" "+p.Namespace+"/"+p.Name && strings.Contains(p.Reason, reason)
}

// ---- Build -----------------------------------------------------------------------------

func TestBuild(t *testing.T) {
	const web = "default/web:http/TCP ips=10.96.0.1 port=80"
	for _, tc := range []struct {
		name     string
		services []*v1.Service
		slices   []*discovery.EndpointSlice
		// want is the dump of every service port, in order.
		want []string
		// problems are "Kind ns/name: reason substring", in order; none when empty.
		problems []string
	}{
		{
			name:     "clusterIP service, one slice",
			services: []*v1.Service{service("web", []string{"10.96.0.1"})},
			slices:   []*discovery.EndpointSlice{v4slice("web-1", "web", ports(tcp("http", 8080)), endpoint("10.0.0.1"), endpoint("10.0.0.2"))},
			want:     []string{web + " eps=10.0.0.1:8080/RS-,10.0.0.2:8080/RS-"},
		},
		{
			name:     "service without slices has no endpoints",
			services: []*v1.Service{service("web", []string{"10.96.0.1"})},
			want:     []string{web},
		},
		{
			name:     "multiple slices are merged in slice name order",
			services: []*v1.Service{service("web", []string{"10.96.0.1"})},
			slices: []*discovery.EndpointSlice{
				v4slice("web-b", "web", ports(tcp("http", 8080)), endpoint("10.0.0.2")),
				v4slice("web-a", "web", ports(tcp("http", 8080)), endpoint("10.0.0.1")),
			},
			want: []string{web + " eps=10.0.0.1:8080/RS-,10.0.0.2:8080/RS-"},
		},
		{
			name:     "duplicate endpoint across slices counts once, first slice by name wins",
			services: []*v1.Service{service("web", []string{"10.96.0.1"})},
			slices: []*discovery.EndpointSlice{
				v4slice("web-b", "web", ports(tcp("http", 8080)), cond(endpoint("10.0.0.1"), no, yes, yes), endpoint("10.0.0.2")),
				v4slice("web-a", "web", ports(tcp("http", 8080)), endpoint("10.0.0.1")),
			},
			want: []string{web + " eps=10.0.0.1:8080/RS-,10.0.0.2:8080/RS-"},
		},
		{
			name:     "same address on another port is another endpoint",
			services: []*v1.Service{service("web", []string{"10.96.0.1"})},
			slices: []*discovery.EndpointSlice{
				v4slice("web-a", "web", ports(tcp("http", 8080)), endpoint("10.0.0.1")),
				v4slice("web-b", "web", ports(tcp("http", 8081)), endpoint("10.0.0.1")),
			},
			want: []string{web + " eps=10.0.0.1:8080/RS-,10.0.0.1:8081/RS-"},
		},
		{
			name:     "only the first address of an endpoint is used",
			services: []*v1.Service{service("web", []string{"10.96.0.1"})},
			slices:   []*discovery.EndpointSlice{v4slice("web-a", "web", ports(tcp("http", 8080)), endpoint("10.0.0.1", "10.0.0.9"))},
			want:     []string{web + " eps=10.0.0.1:8080/RS-"},
		},
		{
			name:     "an endpoint whose first address duplicates another does not fall back to its second",
			services: []*v1.Service{service("web", []string{"10.96.0.1"})},
			slices: []*discovery.EndpointSlice{
				v4slice("web-a", "web", ports(tcp("http", 8080)), endpoint("10.0.0.1")),
				v4slice("web-b", "web", ports(tcp("http", 8080)), endpoint("10.0.0.1", "10.0.0.9")),
			},
			want: []string{web + " eps=10.0.0.1:8080/RS-"},
		},
		{
			name:     "dual-stack: IPv4 and IPv6 slices each feed their own family, FQDN slices ignored",
			services: []*v1.Service{service("web", []string{"10.96.0.1", "fd00:96::1"})},
			slices: []*discovery.EndpointSlice{
				v4slice("web-v4", "web", ports(tcp("http", 8080)), endpoint("10.0.0.1")),
				slice("web-v6", "web", discovery.AddressTypeIPv6, ports(tcp("http", 8080)), endpoint("fd00:244::1")),
				slice("web-fqdn", "web", discovery.AddressTypeFQDN, ports(tcp("http", 8080)), endpoint("example.com")),
			},
			want: []string{"default/web:http/TCP ips=10.96.0.1,fd00:96::1 port=80 eps=10.0.0.1:8080/RS-,[fd00:244::1]:8080/RS-"},
		},
		{
			name:     "IPv6 address in an IPv4 slice and IPv4 address in an IPv6 slice are skipped",
			services: []*v1.Service{service("web", []string{"10.96.0.1", "fd00:96::1"})},
			slices: []*discovery.EndpointSlice{
				v4slice("web-v4", "web", ports(tcp("http", 8080)), endpoint("fd00:244::9"), endpoint("10.0.0.1")),
				slice("web-v6", "web", discovery.AddressTypeIPv6, ports(tcp("http", 8080)), endpoint("10.0.0.9"), endpoint("fd00:244::1")),
			},
			want: []string{"default/web:http/TCP ips=10.96.0.1,fd00:96::1 port=80 eps=10.0.0.1:8080/RS-,[fd00:244::1]:8080/RS-"},
			problems: []string{
				`EndpointSlice default/web-v4: "fd00:244::9" is not an IPv4 address`,
				`EndpointSlice default/web-v6: "10.0.0.9" is not an IPv6 address`,
			},
		},
		{
			name:     "garbage endpoint address is skipped, the rest of the slice is kept",
			services: []*v1.Service{service("web", []string{"10.96.0.1"})},
			slices:   []*discovery.EndpointSlice{v4slice("web-a", "web", ports(tcp("http", 8080)), endpoint("garbage"), endpoint("10.0.0.1"))},
			want:     []string{web + " eps=10.0.0.1:8080/RS-"},
			problems: []string{`EndpointSlice default/web-a: "garbage" is not an IPv4 address`},
		},
		{
			name:     "slices without the service-name label or of another namespace are ignored",
			services: []*v1.Service{service("web", []string{"10.96.0.1"})},
			slices: func() []*discovery.EndpointSlice {
				unlabelled := v4slice("web-x", "web", ports(tcp("http", 8080)), endpoint("10.0.0.8"))
				unlabelled.Labels = nil
				otherNS := v4slice("web-y", "web", ports(tcp("http", 8080)), endpoint("10.0.0.9"))
				otherNS.Namespace = "other"
				return []*discovery.EndpointSlice{unlabelled, otherNS, v4slice("web-a", "web", ports(tcp("http", 8080)), endpoint("10.0.0.1"))}
			}(),
			want: []string{web + " eps=10.0.0.1:8080/RS-"},
		},
		{
			name: "slice ports are matched by name",
			services: []*v1.Service{service("web", []string{"10.96.0.1"}, withPorts(
				svcPort("http", v1.ProtocolTCP, 80, 0), svcPort("metrics", v1.ProtocolTCP, 9090, 0)))},
			slices: []*discovery.EndpointSlice{v4slice("web-a", "web", ports(tcp("metrics", 19090), tcp("http", 8080)), endpoint("10.0.0.1"))},
			want: []string{
				web + " eps=10.0.0.1:8080/RS-",
				"default/web:metrics/TCP ips=10.96.0.1 port=9090 eps=10.0.0.1:19090/RS-",
			},
		},
		{
			name:     "unnamed single port matches the unnamed slice port",
			services: []*v1.Service{service("web", []string{"10.96.0.1"}, withPorts(svcPort("", v1.ProtocolTCP, 80, 0)))},
			slices:   []*discovery.EndpointSlice{v4slice("web-a", "web", ports(tcp("", 8080)), endpoint("10.0.0.1"))},
			want:     []string{"default/web/TCP ips=10.96.0.1 port=80 eps=10.0.0.1:8080/RS-"},
		},
		{
			name: "named targetPort is resolved by the slice port carrying the service port's name",
			services: []*v1.Service{service("web", []string{"10.96.0.1"}, withPorts(v1.ServicePort{
				Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromString("web")}))},
			slices: []*discovery.EndpointSlice{v4slice("web-a", "web", ports(tcp("web", 9999), tcp("http", 8080)), endpoint("10.0.0.1"))},
			want:   []string{web + " eps=10.0.0.1:8080/RS-"},
		},
		{
			name: "slice port with the right name but another protocol is ignored",
			services: []*v1.Service{service("dns", []string{"10.96.0.10"}, withPorts(
				svcPort("dns", v1.ProtocolUDP, 53, 0)))},
			slices: []*discovery.EndpointSlice{v4slice("dns-a", "dns", ports(tcp("dns", 5353)), endpoint("10.0.0.1"))},
			want:   []string{"default/dns:dns/UDP ips=10.96.0.10 port=53"},
		},
		{
			name: "empty protocols default to TCP on both sides",
			services: []*v1.Service{service("web", []string{"10.96.0.1"}, withPorts(
				svcPort("http", "", 80, 0)))},
			slices: []*discovery.EndpointSlice{v4slice("web-a", "web", ports(discovery.EndpointPort{Name: ptr.To("http"), Port: ptr.To(int32(8080))}), endpoint("10.0.0.1"))},
			want:   []string{web + " eps=10.0.0.1:8080/RS-"},
		},
		{
			name:     "UDP and SCTP ports",
			services: []*v1.Service{service("dns", []string{"10.96.0.10"}, withPorts(svcPort("dns", v1.ProtocolUDP, 53, 0), svcPort("diam", v1.ProtocolSCTP, 3868, 0)))},
			slices: []*discovery.EndpointSlice{v4slice("dns-a", "dns", ports(udp("dns", 5353), discovery.EndpointPort{
				Name: ptr.To("diam"), Protocol: ptr.To(v1.ProtocolSCTP), Port: ptr.To(int32(3868))}), endpoint("10.0.0.1"))},
			want: []string{
				"default/dns:diam/SCTP ips=10.96.0.10 port=3868 eps=10.0.0.1:3868/RS-",
				"default/dns:dns/UDP ips=10.96.0.10 port=53 eps=10.0.0.1:5353/RS-",
			},
		},
		{
			name:     "endpoint conditions, nil meaning ready and serving, not terminating",
			services: []*v1.Service{service("web", []string{"10.96.0.1"})},
			slices: []*discovery.EndpointSlice{v4slice("web-a", "web", ports(tcp("http", 8080)),
				cond(endpoint("10.0.0.1"), nil, nil, nil),
				cond(endpoint("10.0.0.2"), yes, yes, no),
				cond(endpoint("10.0.0.3"), no, yes, yes),
				cond(endpoint("10.0.0.4"), no, no, yes),
				cond(endpoint("10.0.0.5"), no, nil, nil),
				cond(endpoint("10.0.0.6"), nil, no, nil),
			)},
			want: []string{web + " eps=10.0.0.1:8080/RS-,10.0.0.2:8080/RS-,10.0.0.3:8080/-ST,10.0.0.4:8080/--T,10.0.0.5:8080/-S-,10.0.0.6:8080/R--"},
		},
		{
			name:     "node name and zone are kept",
			services: []*v1.Service{service("web", []string{"10.96.0.1"})},
			slices:   []*discovery.EndpointSlice{v4slice("web-a", "web", ports(tcp("http", 8080)), onNode(endpoint("10.0.0.1"), "node-a", "zone-a"))},
			want:     []string{web + " eps=10.0.0.1:8080/RS-@node-a%zone-a"},
		},
		{
			name: "ExternalName and headless services are ignored",
			services: []*v1.Service{
				service("ext", []string{"10.96.0.9"}, withType(v1.ServiceTypeExternalName)), // a stale cluster IP must not matter
				service("headless", []string{v1.ClusterIPNone}),
				service("noip", nil),
				service("web", []string{"10.96.0.1"}),
			},
			slices: []*discovery.EndpointSlice{v4slice("headless-a", "headless", ports(tcp("http", 8080)), endpoint("10.0.0.9"))},
			want:   []string{web},
		},
		{
			name: "legacy spec.clusterIP alone is used",
			services: []*v1.Service{func() *v1.Service {
				s := service("web", nil)
				s.Spec.ClusterIP = "10.96.0.1"
				return s
			}()},
			want: []string{web},
		},
		{
			name: "node ports only for NodePort and LoadBalancer services",
			services: []*v1.Service{
				service("a-cip", []string{"10.96.0.1"}, withPorts(svcPort("http", v1.ProtocolTCP, 80, 30001))),
				service("b-np", []string{"10.96.0.2"}, withType(v1.ServiceTypeNodePort), withPorts(svcPort("http", v1.ProtocolTCP, 80, 30002))),
				service("c-lb", []string{"10.96.0.3"}, withType(v1.ServiceTypeLoadBalancer), withPorts(svcPort("http", v1.ProtocolTCP, 80, 30003))),
				service("d-np-unset", []string{"10.96.0.4"}, withType(v1.ServiceTypeNodePort), withPorts(svcPort("http", v1.ProtocolTCP, 80, 0))),
			},
			want: []string{
				"default/a-cip:http/TCP ips=10.96.0.1 port=80",
				"default/b-np:http/TCP ips=10.96.0.2 port=80 np=30002",
				"default/c-lb:http/TCP ips=10.96.0.3 port=80 np=30003",
				"default/d-np-unset:http/TCP ips=10.96.0.4 port=80",
			},
		},
		{
			name: "load-balancer ingress: VIP and nil ipMode kept, Proxy and hostname-only skipped",
			services: []*v1.Service{service("lb", []string{"10.96.0.1"}, withType(v1.ServiceTypeLoadBalancer), withIngress(
				v1.LoadBalancerIngress{IP: "198.51.100.1"},
				v1.LoadBalancerIngress{IP: "198.51.100.2", IPMode: ptr.To(v1.LoadBalancerIPModeVIP)},
				v1.LoadBalancerIngress{IP: "198.51.100.3", IPMode: ptr.To(v1.LoadBalancerIPModeProxy)},
				v1.LoadBalancerIngress{Hostname: "lb.example.com"},
				v1.LoadBalancerIngress{IP: "2001:db8::1"},
			))},
			want: []string{"default/lb:http/TCP ips=10.96.0.1 port=80 lb=198.51.100.1,198.51.100.2,2001:db8::1"},
		},
		{
			name: "ingress IPs of a service that is not a LoadBalancer are ignored",
			services: []*v1.Service{service("np", []string{"10.96.0.1"}, withType(v1.ServiceTypeNodePort), withIngress(
				v1.LoadBalancerIngress{IP: "198.51.100.1"}))},
			want: []string{"default/np:http/TCP ips=10.96.0.1 port=80"},
		},
		{
			name:     "externalIPs of any service type",
			services: []*v1.Service{service("web", []string{"10.96.0.1"}, withExternalIPs("203.0.113.1", "2001:db8::7"))},
			want:     []string{web + " ext=203.0.113.1,2001:db8::7"},
		},
		{
			name: "services are sorted by namespace, name, port name",
			services: []*v1.Service{
				service("zz", []string{"10.96.0.3"}),
				func() *v1.Service { s := service("aa", []string{"10.96.0.4"}); s.Namespace = "kube-system"; return s }(),
				service("aa", []string{"10.96.0.1"}, withPorts(svcPort("b", v1.ProtocolTCP, 2, 0), svcPort("a", v1.ProtocolTCP, 1, 0))),
			},
			want: []string{
				"default/aa:a/TCP ips=10.96.0.1 port=1",
				"default/aa:b/TCP ips=10.96.0.1 port=2",
				"default/zz:http/TCP ips=10.96.0.3 port=80",
				"kube-system/aa:http/TCP ips=10.96.0.4 port=80",
			},
		},

		// Bad input: each yields a problem naming the object and skips only the bad part.
		{
			name: "slice port 0 or nil skips that slice for the port",
			services: []*v1.Service{service("web", []string{"10.96.0.1"}),
				service("zz", []string{"10.96.0.2"})},
			slices: []*discovery.EndpointSlice{
				v4slice("web-a", "web", ports(tcp("http", 0)), endpoint("10.0.0.8")),
				v4slice("web-b", "web", ports(discovery.EndpointPort{Name: ptr.To("http"), Protocol: ptr.To(v1.ProtocolTCP)}), endpoint("10.0.0.9")),
				v4slice("web-c", "web", ports(tcp("http", 8080)), endpoint("10.0.0.1")),
				v4slice("zz-a", "zz", ports(tcp("http", 8080)), endpoint("10.0.0.2")),
			},
			want: []string{web + " eps=10.0.0.1:8080/RS-", "default/zz:http/TCP ips=10.96.0.2 port=80 eps=10.0.0.2:8080/RS-"},
			problems: []string{
				`EndpointSlice default/web-a: port "http": invalid port number`,
				`EndpointSlice default/web-b: port "http": invalid port number`,
			},
		},
		{
			name: "unknown protocol in a service port skips that port only",
			services: []*v1.Service{service("web", []string{"10.96.0.1"}, withPorts(
				svcPort("http", v1.ProtocolTCP, 80, 0), svcPort("icmp", "ICMP", 1, 0)))},
			want:     []string{web},
			problems: []string{`Service default/web: port "icmp": unsupported protocol "ICMP"`},
		},
		{
			name: "invalid service port number skips that port only",
			services: []*v1.Service{service("web", []string{"10.96.0.1"}, withPorts(
				svcPort("http", v1.ProtocolTCP, 80, 0), svcPort("zero", v1.ProtocolTCP, 0, 0), svcPort("big", v1.ProtocolTCP, 70000, 0)))},
			want: []string{web},
			problems: []string{
				`Service default/web: port "zero": invalid port number 0`,
				`Service default/web: port "big": invalid port number 70000`,
			},
		},
		{
			name:     "unknown protocol in a slice port skips that slice for the port",
			services: []*v1.Service{service("web", []string{"10.96.0.1"})},
			slices: []*discovery.EndpointSlice{
				v4slice("web-a", "web", ports(discovery.EndpointPort{Name: ptr.To("http"), Protocol: ptr.To(v1.Protocol("ICMP")), Port: ptr.To(int32(8080))}), endpoint("10.0.0.9")),
				v4slice("web-b", "web", ports(tcp("http", 8080)), endpoint("10.0.0.1")),
			},
			want:     []string{web + " eps=10.0.0.1:8080/RS-"},
			problems: []string{`EndpointSlice default/web-a: port "http": unsupported protocol "ICMP"`},
		},
		{
			name: "garbage cluster IP skips the service, not the others",
			services: []*v1.Service{service("bad", []string{"10.96.0.300"}),
				service("web", []string{"10.96.0.1"})},
			slices:   []*discovery.EndpointSlice{v4slice("bad-a", "bad", ports(tcp("http", 8080)), endpoint("10.0.0.9"))},
			want:     []string{web},
			problems: []string{`Service default/bad: clusterIP "10.96.0.300" is not an IP address`},
		},
		{
			name:     "garbage second cluster IP is dropped, the first kept",
			services: []*v1.Service{service("web", []string{"10.96.0.1", "garbage"})},
			want:     []string{web},
			problems: []string{`Service default/web: clusterIP "garbage" is not an IP address`},
		},
		{
			name:     "garbage externalIP is dropped, the service kept",
			services: []*v1.Service{service("web", []string{"10.96.0.1"}, withExternalIPs("203.0.113.1", "not-an-ip", "203.0.113.2"))},
			want:     []string{web + " ext=203.0.113.1,203.0.113.2"},
			problems: []string{`Service default/web: externalIP "not-an-ip" is not an IP address`},
		},
		{
			name: "garbage load-balancer ingress IP is dropped",
			services: []*v1.Service{service("lb", []string{"10.96.0.1"}, withType(v1.ServiceTypeLoadBalancer), withIngress(
				v1.LoadBalancerIngress{IP: "198.51.100.999"}, v1.LoadBalancerIngress{IP: "198.51.100.1"}))},
			want:     []string{"default/lb:http/TCP ips=10.96.0.1 port=80 lb=198.51.100.1"},
			problems: []string{`Service default/lb: load-balancer ingress IP "198.51.100.999" is not an IP address`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap, problems := model.Build(tc.services, tc.slices, nil)
			got := dumpSnapshot(snap)
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("services:\n got  %s\n want %s", strings.Join(got, "\n      "), strings.Join(tc.want, "\n      "))
			}
			checkProblems(t, problems, tc.problems)
		})
	}
}

func checkProblems(t *testing.T, got []model.Problem, want []string) {
	t.Helper()
	ok := len(got) == len(want)
	for i := 0; ok && i < len(got); i++ {
		ok = problemMatches(got[i], want[i])
	}
	if !ok {
		gs := make([]string, len(got))
		for i, p := range got {
			gs[i] = p.String()
		}
		t.Errorf("problems:\n got  %q\n want %q", gs, want)
	}
}

// TestBuildProblemsReportedOnce: a Problem is logged and turned into an event, so one bad
// field must give one Problem however many service ports read the slice.
func TestBuildProblemsReportedOnce(t *testing.T) {
	svc := service("web", []string{"10.96.0.1"}, withPorts(
		svcPort("http", v1.ProtocolTCP, 80, 0), svcPort("https", v1.ProtocolTCP, 443, 0)))
	sl := v4slice("web-a", "web", ports(tcp("http", 8080), tcp("https", 8443)), endpoint("garbage"), endpoint("10.0.0.1"))
	snap, problems := model.Build([]*v1.Service{svc}, []*discovery.EndpointSlice{sl}, nil)
	want := []string{
		"default/web:http/TCP ips=10.96.0.1 port=80 eps=10.0.0.1:8080/RS-",
		"default/web:https/TCP ips=10.96.0.1 port=443 eps=10.0.0.1:8443/RS-",
	}
	if got := dumpSnapshot(snap); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("services:\n got  %q\n want %q", got, want)
	}
	checkProblems(t, problems, []string{`EndpointSlice default/web-a: "garbage" is not an IPv4 address`})
}

// TestBuildMany checks that large objects are neither truncated nor reported.
func TestBuildMany(t *testing.T) {
	t.Run("slice with 5000 endpoints", func(t *testing.T) {
		var eps []discovery.Endpoint
		for i := range 5000 {
			eps = append(eps, endpoint(fmt.Sprintf("10.1.%d.%d", i/256, i%256)))
		}
		snap, problems := model.Build([]*v1.Service{service("web", []string{"10.96.0.1"})},
			[]*discovery.EndpointSlice{v4slice("web-a", "web", ports(tcp("http", 8080)), eps...)}, nil)
		checkProblems(t, problems, nil)
		if len(snap.Services) != 1 {
			t.Fatalf("got %d service ports, want 1", len(snap.Services))
		}
		got := snap.Services[0].Endpoints
		if len(got) != 5000 {
			t.Fatalf("got %d endpoints, want 5000", len(got))
		}
		seen := map[netip.AddrPort]bool{}
		for _, e := range got {
			if seen[e.AddrPort()] || !e.Ready || e.Port != 8080 {
				t.Fatalf("bad or duplicate endpoint %s", dumpEndpoint(e))
			}
			seen[e.AddrPort()] = true
		}
	})
	t.Run("service with 100 ports", func(t *testing.T) {
		var sps []v1.ServicePort
		var eps []discovery.EndpointPort
		for i := range 100 {
			name := fmt.Sprintf("p%03d", i)
			sps = append(sps, svcPort(name, v1.ProtocolTCP, int32(1000+i), 0))
			eps = append(eps, tcp(name, int32(2000+i)))
		}
		snap, problems := model.Build([]*v1.Service{service("web", []string{"10.96.0.1"}, withPorts(sps...))},
			[]*discovery.EndpointSlice{v4slice("web-a", "web", eps, endpoint("10.0.0.1"))}, nil)
		checkProblems(t, problems, nil)
		if len(snap.Services) != 100 {
			t.Fatalf("got %d service ports, want 100", len(snap.Services))
		}
		for i, sp := range snap.Services {
			want := fmt.Sprintf("default/web:p%03d/TCP ips=10.96.0.1 port=%d eps=10.0.0.1:%d/RS-", i, 1000+i, 2000+i)
			if got := dumpPort(sp); got != want {
				t.Errorf("port %d:\n got  %s\n want %s", i, got, want)
			}
		}
	})
}

func TestBuildNode(t *testing.T) {
	for _, tc := range []struct {
		name     string
		node     *v1.Node
		wantIPs  string
		wantZone string
	}{
		{name: "nil node", node: nil},
		{name: "one InternalIP", node: node(nil, internalIP("10.0.0.5")), wantIPs: "10.0.0.5"},
		{
			name:    "InternalIP wins over an earlier ExternalIP",
			node:    node(nil, externalIP("203.0.113.5"), internalIP("10.0.0.5")),
			wantIPs: "10.0.0.5",
		},
		{
			name:    "first InternalIP of each family, in address order",
			node:    node(nil, internalIP("fd00::5"), internalIP("10.0.0.5"), internalIP("10.0.0.6"), internalIP("fd00::6")),
			wantIPs: "fd00::5,10.0.0.5",
		},
		{
			name:    "ExternalIP is the fallback for a family without InternalIP",
			node:    node(nil, internalIP("10.0.0.5"), externalIP("203.0.113.5"), externalIP("2001:db8::5")),
			wantIPs: "10.0.0.5,2001:db8::5",
		},
		{
			name:    "garbage and non-IP address types are ignored",
			node:    node(nil, internalIP("garbage"), v1.NodeAddress{Type: v1.NodeHostName, Address: "10.9.9.9"}, internalIP("10.0.0.5")),
			wantIPs: "10.0.0.5",
		},
		{
			name:    "IPv4-mapped IPv6 address counts as IPv4",
			node:    node(nil, internalIP("::ffff:10.0.0.5"), internalIP("10.0.0.6")),
			wantIPs: "10.0.0.5",
		},
		{
			name:     "zone label",
			node:     node(map[string]string{v1.LabelTopologyZone: "zone-a"}, internalIP("10.0.0.5")),
			wantIPs:  "10.0.0.5",
			wantZone: "zone-a",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap, problems := model.Build(nil, nil, tc.node)
			checkProblems(t, problems, nil)
			if got := addrs(snap.Node.IPs); got != tc.wantIPs {
				t.Errorf("node IPs = %q, want %q", got, tc.wantIPs)
			}
			if snap.Node.Zone != tc.wantZone {
				t.Errorf("zone = %q, want %q", snap.Node.Zone, tc.wantZone)
			}
			if wantName := map[bool]string{true: "node-1", false: ""}[tc.node != nil]; snap.Node.Name != wantName {
				t.Errorf("name = %q, want %q", snap.Node.Name, wantName)
			}
		})
	}
}
