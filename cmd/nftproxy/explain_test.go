package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
)

// cluster returns API objects with one service of each kind.
func cluster() []runtime.Object {
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}, Status: v1.NodeStatus{Addresses: []v1.NodeAddress{
		{Type: v1.NodeInternalIP, Address: "192.0.2.10"}, {Type: v1.NodeInternalIP, Address: "2001:db8::10"}}}}
	cidr := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/16"}}}
	objs := []runtime.Object{node, cidr,
		service("echo", "ClusterIP", []string{"10.96.0.10", "fd00:96::10"}, 80, 0),
		slice("echo", "echo-v4", discovery.AddressTypeIPv4, "node-2", "10.244.1.2", "10.244.1.3"),
		slice("echo", "echo-v6", discovery.AddressTypeIPv6, "node-2", "fd00:244::1:2"),
		service("web", "NodePort", []string{"10.96.1.1"}, 443, 30443, "203.0.113.7"),
		slice("web", "web", discovery.AddressTypeIPv4, "node-2", "10.244.1.4"),
		service("empty", "NodePort", []string{"10.96.1.2"}, 80, 30080),
		service("local", "NodePort", []string{"10.96.1.3"}, 80, 30100),
		slice("local", "local", discovery.AddressTypeIPv4, "node-2", "10.244.1.5"),
	}
	objs[len(objs)-2].(*v1.Service).Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	lb := service("lb", "LoadBalancer", []string{"10.96.1.4"}, 443, 30444)
	lb.Spec.LoadBalancerSourceRanges = []string{"203.0.113.0/24"}
	lb.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "198.51.100.1"}}
	sticky := service("sticky", "ClusterIP", []string{"10.96.1.5"}, 80, 0)
	sticky.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	return append(objs, lb, slice("lb", "lb", discovery.AddressTypeIPv4, "node-2", "10.244.1.6"),
		sticky, slice("sticky", "sticky", discovery.AddressTypeIPv4, "node-2", "10.244.1.7", "10.244.1.8", "10.244.1.9"))
}

func service(name, typ string, ips []string, port, nodePort int32, externalIPs ...string) *v1.Service {
	return &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}, Spec: v1.ServiceSpec{
		Type: v1.ServiceType(typ), ClusterIP: ips[0], ClusterIPs: ips, ExternalIPs: externalIPs,
		Ports: []v1.ServicePort{{Protocol: v1.ProtocolTCP, Port: port, NodePort: nodePort}},
	}}
}

func slice(svc, name string, typ discovery.AddressType, node string, addrs ...string) *discovery.EndpointSlice {
	port, ready := int32(8080), true
	s := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{discovery.LabelServiceName: svc}},
		AddressType: typ,
		Ports:       []discovery.EndpointPort{{Port: &port}},
	}
	for _, a := range addrs {
		s.Endpoints = append(s.Endpoints, discovery.Endpoint{Addresses: []string{a}, NodeName: &node, Conditions: discovery.EndpointConditions{Ready: &ready}})
	}
	return s
}

// TestExplain explains packets to each kind of service from API objects.
func TestExplain(t *testing.T) {
	client := fake.NewClientset(cluster()...)
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"10.96.0.10:80"}, []string{
			"tcp 10.244.0.1 (a pod) → 10.96.0.10:80, arriving from the network", "service default/echo",
			"50%  → 10.244.1.2:8080, client address kept", "50%  → 10.244.1.3:8080, client address kept"}},
		{[]string{"--from", "172.16.0.9", "10.96.0.10:80"}, []string{"→ 10.244.1.3:8080, masqueraded: the source is outside the cluster CIDR 10.244.0.0/16"}},
		{[]string{"--rules", "10.96.0.10:80"}, []string{"service default/echo",
			"services: ip daddr . meta l4proto . th dport @cluster-frontends goto cluster-frontend",
			`@cluster-frontends: 10.96.0.10 . tcp . 80 comment "default/echo"`,
			"dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 2 map @endpoints",
			"@endpoints: 10.96.0.10 . tcp . 80 . 0 : 10.244.1.2 . 8080", "@endpoints: 10.96.0.10 . tcp . 80 . 1 : 10.244.1.3 . 8080"}},
		{[]string{"--from", "10.244.1.2", "10.96.0.10:80"}, []string{
			"→ 10.244.1.2:8080, masqueraded: hairpin", "→ 10.244.1.3:8080, client address kept"}},
		{[]string{"--local", "10.96.0.10:80"}, []string{"tcp 192.0.2.10 (the node) → 10.96.0.10:80, sent by the node itself", "masqueraded: the source is outside"}},
		{[]string{"[fd00:96::10]:80"}, []string{"tcp fd00:244::1 (a pod) → [fd00:96::10]:80", "  → [fd00:244::1:2]:8080, client address kept"}},
		{[]string{"--from", "203.0.113.5", "192.0.2.10:30443"}, []string{"service default/web", "→ 10.244.1.4:8080, masqueraded: external traffic"}},
		{[]string{"--from", "203.0.113.5", "203.0.113.7:443"}, []string{"service default/web", "→ 10.244.1.4:8080, masqueraded: external traffic"}},
		{[]string{"10.96.1.2:80"}, []string{"service default/empty", "  rejected: no endpoints: the service has no ready endpoints"}},
		{[]string{"--from", "203.0.113.5", "192.0.2.10:30080"}, []string{"  rejected: no endpoints"}},
		{[]string{"10.96.0.10:81"}, []string{"  rejected: port 81/TCP is not a port of service default/echo (80/TCP)"}},
		{[]string{"10.96.0.10:80/udp"}, []string{"  rejected: port 80/UDP is not a port of service default/echo (80/TCP)"}},
		{[]string{"10.96.9.9:80"}, []string{"  dropped: no service uses this address (an unallocated address of the service CIDR 10.96.0.0/16)"}},
		{[]string{"8.8.8.8:53/udp"}, []string{"  not translated: no service uses this address"}},
		{[]string{"192.0.2.10:22"}, []string{"  not translated: no node port 22/TCP"}},
		{[]string{"--from", "203.0.113.7", "203.0.113.7:8443"}, []string{"  not translated: port 8443/TCP is not a port of service default/web (443/TCP)"}},
		{[]string{"--from", "203.0.113.5", "192.0.2.10:30100"}, []string{"service default/local", "  dropped: no local endpoints"}},
		{[]string{"--from", "10.244.3.3", "192.0.2.10:30100"}, []string{"  → 10.244.1.5:8080, client address kept"}},
		{[]string{"--from", "203.0.113.5", "198.51.100.1:443"}, []string{"service default/lb", "  → 10.244.1.6:8080, masqueraded: external traffic"}},
		{[]string{"--from", "172.16.0.9", "198.51.100.1:443"}, []string{"  dropped: the source 172.16.0.9 is not in the service's loadBalancerSourceRanges"}},
		{[]string{"10.96.1.5:80"}, []string{"service default/sticky", "33.3%  → 10.244.1.7:8080", "33.3%  → 10.244.1.9:8080",
			"session affinity (ClientIP): a client seen recently goes back to its endpoint"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			req, err := parseExplain(append([]string{"--hostname-override=node-1", "--cluster-cidr=10.244.0.0/16,fd00:244::/56"}, tc.args...), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			var b bytes.Buffer
			if err := explain(context.Background(), client, req, &b); err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, b.String())
				}
			}
		})
	}
}

// Under --detect-local-mode=InterfaceNamePrefix the masquerade reason names the
// interfaces; a packet given by --from did not come in through them.
func TestExplainInterfaceMode(t *testing.T) {
	client := fake.NewClientset(cluster()...)
	req, err := parseExplain([]string{"--hostname-override=node-1", "--detect-local-mode=InterfaceNamePrefix", "--pod-interface-name-prefix=veth",
		"--from", "10.244.3.3", "10.96.0.10:80"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := explain(context.Background(), client, req, &b); err != nil {
		t.Fatal(err)
	}
	if want := "masqueraded: the packet did not come in through the pods' interface veth* (--detect-local-mode)"; !strings.Contains(b.String(), want) {
		t.Errorf("output lacks %q:\n%s", want, b.String())
	}
}

func TestParseExplain(t *testing.T) {
	req, err := parseExplain([]string{"--rules", "--local", "--from", "192.0.2.10", "--cluster-cidr", "10.244.0.0/16", "10.96.0.10:53/udp"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !req.q.Rules || !req.q.Local || req.q.From != "192.0.2.10" || req.q.Dest.String() != "10.96.0.10:53" || req.q.Proto != 17 || req.opts.ClusterCIDR != "10.244.0.0/16" {
		t.Errorf("parsed %+v", req)
	}
	if _, err := parseExplain([]string{"--help"}, io.Discard); !errors.Is(err, pflag.ErrHelp) {
		t.Errorf("--help: %v", err)
	}
	for _, args := range [][]string{{}, {"10.96.0.10:80", "10.96.0.11:80"}, {"10.96.0.10"}, {"--cluster-cidr", "bogus", "10.96.0.10:80"}} {
		if _, err := parseExplain(args, io.Discard); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}
