package e2e

// TestHostileTenant (docs/security.md's end-to-end proof): a second namespace, with what a
// namespace-scoped writer can do, tries each of docs/security.md's items 1, 3, 6, 7 and 10 against a first namespace's
// services and against the node, on a real apiserver with real packets. Throughout, the
// first namespace's traffic never moves, the node's own ports stay unreachable through
// service addresses, and nftproxy's RSS stays under hostileRSSBound.
//
//	NFTPROXY_E2E=1 go test ./e2e/ -count=1 -v -run TestHostileTenant

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/nftproxy/nftproxy/e2e/cluster"
)

const (
	victimNS = "victim"
	tenantNS = "tenant"
	// hostileRSSBound bounds nftproxy's RSS after every attack, the 200,000-frontend
	// Service included (which, compiled, cost 154 MiB live before the limits).
	hostileRSSBound = 100 << 10 // KiB
	victimExtIP     = "203.0.113.20"
	tenantLBIP      = "198.51.100.30"
)

func TestHostileTenant(t *testing.T) {
	cluster.Require(t)
	e := &env{bin: buildNftproxy(t)}
	// Objects stored before the API validated CIDRs strictly still hold legacy forms
	// such as "010.000.0.0/8"; an apiserver with the strict validation off stores them.
	e.c = cluster.StartT(t, cluster.Config{APIServerArgs: []string{"--feature-gates=StrictIPCIDRValidation=false"}})
	c := e.c
	e.setupRoutes(t)
	pod := func(name string) *cluster.Pod {
		p, err := c.AddPod(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	v1, v2, evil, client := pod("victim-1"), pod("victim-2"), pod("tenant-1"), pod("client")
	e.client = client
	for _, n := range []string{victimNS, tenantNS} {
		if _, err := c.Client.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// --nodeport-addresses 0.0.0.0/0 covers 127.0.0.0/8 (docs/security.md, item 6).
	e.startProxy(t, c.LeastPrivilegeKubeconfigT(t), append([]string{"--nodeport-addresses", "0.0.0.0/0"}, cluster.WatchedFlags...)...)

	// The first namespace: web, with a cluster IP, an externalIP and a node port.
	web := e.nsService(t, victimNS, "web", corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort,
		Ports: []corev1.ServicePort{tcpPort("http", 80, 8080)}, ExternalIPs: []string{victimExtIP}})
	e.nsSlice(t, web, v1.IP.String(), v2.IP.String())
	victims := []*cluster.Pod{v1, v2}
	vCluster := hostPort(web.Spec.ClusterIP, 80)
	vExternal := hostPort(victimExtIP, 80)
	vNodePort := hostPort(c.NodeIP.String(), web.Spec.Ports[0].NodePort)
	healthz := fmt.Sprintf("http://%s/healthz", hostPort(c.NodeIP.String(), 10256))
	e.waitOK(t, "victim cluster IP", client.NS, "tcp", vCluster)
	e.waitOK(t, "victim externalIP", c.ExternalNS, "tcp", vExternal)
	// victimUnmoved checks everything the first namespace and the node serve.
	victimUnmoved := func(t *testing.T, when string) {
		t.Helper()
		expectAnswered(t, when+": pod -> victim cluster IP "+vCluster, e.probe(t, client.NS, "tcp", vCluster, 8, time.Second), victims, nil)
		expectAnswered(t, when+": external -> victim externalIP "+vExternal, e.probe(t, c.ExternalNS, "tcp", vExternal, 4, time.Second), victims, nil)
		expectAnswered(t, when+": external -> victim node port "+vNodePort, e.probe(t, c.ExternalNS, "tcp", vNodePort, 4, time.Second), victims, nil)
		code, body, err := c.HTTPGet(t.Context(), c.ExternalNS, healthz)
		if err != nil || code != 200 || !strings.Contains(string(body), "lastUpdated") {
			t.Errorf("%s: the node's healthz %s answered %d %q (%v), want nftproxy's 200", when, healthz, code, body, err)
		}
		if rss := vmRSS(t, e.proxy.PID()); rss > hostileRSSBound {
			t.Errorf("%s: nftproxy RSS %d KiB, over the bound of %d KiB", when, rss, hostileRSSBound)
		} else {
			t.Logf("%s: nftproxy RSS %.1f MiB", when, float64(rss)/1024)
		}
	}
	victimUnmoved(t, "before")
	// creationTimestamp has one-second resolution and same-second ties go by
	// namespace/name ("tenant" < "victim"): the tenant arrives at least a second later
	if d := time.Until(web.CreationTimestamp.Add(1100 * time.Millisecond)); d > 0 {
		time.Sleep(d)
	}
	tenantPorts := func(ports ...int32) []corev1.ServicePort {
		var out []corev1.ServicePort
		for _, p := range ports {
			out = append(out, tcpPort(fmt.Sprintf("p%d", p), p, 8080))
		}
		return out
	}

	e.run(t, "1-externalip-on-a-cluster-ip", func(t *testing.T) {
		// the victim's cluster IP on its own port and on another, and the victim's
		// externalIP (the victim is older: it keeps it)
		s := e.nsService(t, tenantNS, "a-hijack", corev1.ServiceSpec{Ports: tenantPorts(80, 81),
			ExternalIPs: []string{web.Spec.ClusterIP, victimExtIP}})
		e.nsSlice(t, s, evil.IP.String())
		// a load-balancer IP that is the victim's cluster IP (status written by the tenant's
		// controller)
		lb := e.nsService(t, tenantNS, "a-lb", corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: tenantPorts(80)})
		e.nsSlice(t, lb, evil.IP.String())
		e.setIngress(t, lb, web.Spec.ClusterIP)
		e.waitEvent(t, "a-hijack", "externalIP "+web.Spec.ClusterIP+" is a cluster IP, refused")
		e.waitEvent(t, "a-hijack", "is in use by another Service")
		e.waitEvent(t, "a-lb", "load-balancer IP "+web.Spec.ClusterIP+" is a cluster IP, refused")
		// the tenant's own cluster IP works: the check is not vacuous
		e.waitOK(t, "tenant's own cluster IP", client.NS, "tcp", hostPort(s.Spec.ClusterIP, 80))
		res := e.probe(t, client.NS, "tcp", hostPort(web.Spec.ClusterIP, 81), 3, time.Second)
		if !noneOK(res) {
			t.Errorf("victim cluster IP on port 81 answered: %s", summary(res))
		}
		victimUnmoved(t, "after item 1")
	})

	e.run(t, "1-node-own-ports", func(t *testing.T) {
		s := e.nsService(t, tenantNS, "node-ports", corev1.ServiceSpec{Ports: tenantPorts(10256, 10249, 8081),
			ExternalIPs: []string{c.NodeIP.String()}})
		e.nsSlice(t, s, evil.IP.String())
		e.waitEvent(t, "node-ports", "TCP port 10256 is served by nftproxy itself, refused")
		e.waitEvent(t, "node-ports", "TCP port 10249 is served by nftproxy itself, refused")
		// a node-IP externalIP on another port stays allowed (operators use it)
		e.waitOK(t, "node IP externalIP on 8081", c.ExternalNS, "tcp", hostPort(c.NodeIP.String(), 8081))
		res := e.probe(t, c.ExternalNS, "tcp", hostPort(c.NodeIP.String(), 10256), 3, time.Second)
		for _, r := range res {
			if r.OK && r.Pod == evil.Name {
				t.Errorf("the node's healthz port reached the tenant's pod: %s", summary(res))
				break
			}
		}
		victimUnmoved(t, "after the node's ports")
	})

	e.run(t, "3-one-service-200000-frontends", func(t *testing.T) {
		// the 32 KB object: 100 ports × 2,000 externalIPs
		var ext []string
		for i := range 2000 {
			ext = append(ext, fmt.Sprintf("100.%d.%d.%d", 64+i/65536, (i/256)%256, i%256))
		}
		var ports []corev1.ServicePort
		for p := range int32(100) {
			ports = append(ports, tcpPort(fmt.Sprintf("p%d", p), 1000+p, 8080))
		}
		s := e.nsService(t, tenantNS, "wide", corev1.ServiceSpec{Ports: ports, ExternalIPs: ext})
		e.nsSlice(t, s, evil.IP.String())
		e.waitEvent(t, "wide", "frontends (ports × cluster, external and load-balancer IPs), more than --max-frontends-per-service=1000")
		res := e.probe(t, client.NS, "tcp", hostPort(s.Spec.ClusterIP, 1000), 2, time.Second)
		if !noneOK(res) {
			t.Errorf("the set-aside Service answered: %s", summary(res))
		}
		victimUnmoved(t, "after item 3")
	})

	e.run(t, "6-node-port-never-on-loopback", func(t *testing.T) {
		s := e.nsService(t, tenantNS, "np", corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Ports: tenantPorts(80)})
		e.nsSlice(t, s, evil.IP.String())
		np := s.Spec.Ports[0].NodePort
		e.waitOK(t, "tenant node port on the node IP", c.ExternalNS, "tcp", hostPort(c.NodeIP.String(), np))
		// a node where kube-proxy's iptables mode ran has route_localnet=1: a packet from
		// 127.0.0.1 DNATed to a pod is then routed (in the node's own namespace only)
		if out, err := c.Exec(t.Context(), c.NodeNS, "sysctl", "-qw", "net.ipv4.conf.all.route_localnet=1"); err != nil {
			t.Fatalf("sysctl route_localnet in %s: %v %s", c.NodeNS, err, out)
		}
		// nothing listens on the node port on 127.0.0.1: refused, not DNATed
		res := e.probe(t, c.NodeNS, "tcp", hostPort("127.0.0.1", np), 3, time.Second)
		if !allRefused(res) {
			t.Errorf("node port %d on 127.0.0.1 in the node was not simply refused: %s", np, summary(res))
		} else {
			t.Logf("node -> 127.0.0.1:%d: %s", np, summary(res))
		}
	})

	e.run(t, "7-legacy-source-range", func(t *testing.T) {
		s := e.nsService(t, tenantNS, "lb-ranges", corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: tenantPorts(80),
			LoadBalancerSourceRanges: []string{" 010.000.0.0/8"}})
		e.nsSlice(t, s, evil.IP.String())
		e.setIngress(t, s, tenantLBIP)
		addr := hostPort(tenantLBIP, 80)
		// read as 10.0.0.0/8: pods (10.244.x) are let in, the external client is not
		e.waitOK(t, "pod inside the legacy range reaches the LB", client.NS, "tcp", addr)
		res := e.probe(t, c.ExternalNS, "tcp", addr, 3, time.Second)
		if !noneOK(res) {
			t.Errorf("the LB answered a client outside its source range: %s", summary(res))
		} else {
			t.Logf("external -> %s: %s", addr, summary(res))
		}
	})

	e.run(t, "10-endpoint-addresses", func(t *testing.T) {
		s := e.nsService(t, tenantNS, "fwd", corev1.ServiceSpec{Ports: tenantPorts(80)})
		// the API refuses loopback, link-local and unspecified endpoints today
		for _, bad := range []string{"127.0.0.1", "169.254.169.254", "0.0.0.0"} {
			if err := e.tryNsSlice(t, s, "bad-"+strings.NewReplacer(".", "-").Replace(bad), bad); err == nil {
				t.Logf("the API stored an endpoint %s; nftproxy must skip it", bad)
				e.waitEvent(t, "", "endpoint address "+bad)
			}
		}
		// it accepts another service's cluster IP
		e.nsSlice(t, s, web.Spec.ClusterIP)
		e.waitEvent(t, "fwd", "endpoint address "+web.Spec.ClusterIP+" is a service's cluster IP, skipped")
		e.waitRefused(t, "fwd has no usable endpoint: rejected", client.NS, "tcp", hostPort(s.Spec.ClusterIP, 80))
		victimUnmoved(t, "after item 10")
	})

	e.run(t, "8-events-name-no-other-namespace", func(t *testing.T) {
		evs, err := c.Client.CoreV1().Events(tenantNS).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, ev := range evs.Items {
			if ev.Reason != "NftproxyIgnored" {
				continue
			}
			n++
			if strings.Contains(ev.Message, victimNS) || strings.Contains(ev.Message, "web") {
				t.Errorf("event on %s names the other namespace's service: %s", ev.InvolvedObject.Name, ev.Message)
			}
		}
		if n == 0 {
			t.Errorf("no NftproxyIgnored events in %s", tenantNS)
		}
		t.Logf("%d NftproxyIgnored events in %s, none naming %s", n, tenantNS, victimNS)
	})

	victimUnmoved(t, "at the end")
}

// nsService creates a selector-less Service in namespace ns.
func (e *env) nsService(t *testing.T, ns, name string, spec corev1.ServiceSpec) *corev1.Service {
	t.Helper()
	svc, err := e.c.Client.CoreV1().Services(ns).Create(t.Context(), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create service %s/%s: %v", ns, name, err)
	}
	t.Logf("service %s/%s: clusterIP %s, %d ports", ns, name, svc.Spec.ClusterIP, len(svc.Spec.Ports))
	return svc
}

// nsSlice puts the EndpointSlice "<svc>-e2e" with ready endpoints at addrs.
func (e *env) nsSlice(t *testing.T, svc *corev1.Service, addrs ...string) {
	t.Helper()
	if err := e.tryNsSlice(t, svc, svc.Name+"-e2e", addrs...); err != nil {
		t.Fatal(err)
	}
}

func (e *env) tryNsSlice(t *testing.T, svc *corev1.Service, name string, addrs ...string) error {
	t.Helper()
	var eps []discoveryv1.Endpoint
	for _, a := range addrs {
		eps = append(eps, discoveryv1.Endpoint{Addresses: []string{a}, NodeName: ptr.To("node-1"),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}})
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: svc.Namespace,
			Labels: map[string]string{discoveryv1.LabelServiceName: svc.Name, discoveryv1.LabelManagedBy: "e2e"}},
		AddressType: discoveryv1.AddressTypeIPv4, Endpoints: eps, Ports: slicePorts(svc.Spec.Ports...),
	}
	if a, err := netip.ParseAddr(addrs[0]); err == nil && a.Is6() {
		slice.AddressType = discoveryv1.AddressTypeIPv6
	}
	_, err := e.c.Client.DiscoveryV1().EndpointSlices(svc.Namespace).Create(t.Context(), slice, metav1.CreateOptions{})
	if err != nil {
		t.Logf("endpoint slice %s/%s with %v: %v", svc.Namespace, name, addrs, err)
	}
	return err
}

// setIngress writes the Service's load-balancer status (what the tenant's own
// load-balancer controller could do).
func (e *env) setIngress(t *testing.T, svc *corev1.Service, ip string) {
	t.Helper()
	cur, err := e.c.Client.CoreV1().Services(svc.Namespace).Get(t.Context(), svc.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: ip}}
	if _, err := e.c.Client.CoreV1().Services(svc.Namespace).UpdateStatus(t.Context(), cur, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update status of %s: %v", svc.Name, err)
	}
}

// waitEvent waits for a Warning event from nftproxy in the tenant's namespace, on the
// object named obj ("" for any), whose message contains text.
func (e *env) waitEvent(t *testing.T, obj, text string) {
	t.Helper()
	deadline := time.Now().Add(converge)
	for {
		evs, err := e.c.Client.CoreV1().Events(tenantNS).List(t.Context(), metav1.ListOptions{})
		if err == nil {
			for _, ev := range evs.Items {
				if ev.Type == corev1.EventTypeWarning && (obj == "" || ev.InvolvedObject.Name == obj) && strings.Contains(ev.Message, text) {
					t.Logf("event on %s/%s: %s", tenantNS, ev.InvolvedObject.Name, ev.Message)
					return
				}
			}
		}
		if time.Now().After(deadline) || !e.proxy.Running() {
			var msgs []string
			if evs != nil {
				for _, ev := range evs.Items {
					msgs = append(msgs, ev.InvolvedObject.Name+": "+ev.Message)
				}
			}
			t.Fatalf("no event on %q containing %q within %v (err %v); events:\n%s\nlog:\n%s", obj, text, converge, err, strings.Join(msgs, "\n"), e.proxy.Tail(20))
		}
		select {
		case <-t.Context().Done():
			t.Fatal(context.Cause(t.Context()))
		case <-time.After(200 * time.Millisecond):
		}
	}
}
