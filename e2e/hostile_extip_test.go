package e2e

// TestHostileExternalIPs: on two nodes, each with its own nftproxy, a second namespace
// points externalIPs at the first namespace's pods and at node-1's address on the
// first namespace's node port and health-check node port, and lists the first
// namespace's DNS pod as an endpoint of a UDP Service that declares the DNS cluster IP.
// Real packets show that the first namespace's cluster IP, pod and node-port traffic
// still reaches only its pods, the health check answers from nftproxy, and the DNS
// flow's conntrack entry survives the tenant's endpoint change.
//
//	NFTPROXY_E2E=1 go test ./e2e/ -count=1 -v -run '^TestHostileExternalIPs$'

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/e2e/cluster"
)

func TestHostileExternalIPs(t *testing.T) {
	cluster.Require(t)
	e := &env{bin: buildNftproxy(t)}
	e.c = cluster.StartT(t, cluster.Config{})
	c, ctx := e.c, t.Context()
	n1 := c.Node(c.NodeName)
	n2, err := c.AddNode(ctx, "node-2")
	if err != nil {
		t.Fatal(err)
	}
	pod := func(n *cluster.Node, name string) *cluster.Pod {
		p, err := c.AddPodOn(ctx, n, name)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	v1, v2, evil := pod(n1, "victim-1"), pod(n2, "victim-2"), pod(n2, "tenant-1")
	client1, client2 := pod(n1, "client-1"), pod(n2, "client-2")
	e.client = client1
	for _, n := range []string{victimNS, tenantNS} {
		if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	kubeconfig := c.LeastPrivilegeKubeconfigT(t)
	e.startProxy(t, kubeconfig, cluster.WatchedFlags...)
	p2, err := c.StartProcess(n2.NS, "nftproxy-node-2", append([]string{e.bin}, cluster.NftproxyArgs(kubeconfig, n2.Name, clusterCIDR, cluster.WatchedFlags...)...)...)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if _, err := c.Exec(ctx, n2.NS, "nft", "list", "table", "ip", tableName); err == nil {
			break
		}
		if !p2.Running() || time.Now().After(deadline) {
			t.Fatalf("nftproxy on node-2: no table within 60s; log:\n%s", p2.Tail(40))
		}
	}

	// The first namespace: web (node port, pods on both nodes), lb (Local policy: a
	// health-check node port), dns (UDP, its pod on node-1).
	web := e.nsService(t, victimNS, "web", corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Ports: []corev1.ServicePort{tcpPort("http", 80, 8080)}})
	e.nsSlice(t, web, v1.IP.String(), v2.IP.String())
	lb := e.nsService(t, victimNS, "lb", corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer,
		ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal, Ports: []corev1.ServicePort{tcpPort("http", 80, 8080)}})
	e.nsSlice(t, lb, v1.IP.String()) // on node-1, as nsSlice says
	dns := e.nsService(t, victimNS, "dns", corev1.ServiceSpec{Ports: []corev1.ServicePort{udpPort("dns", 53, 9090)}})
	e.nsSlice(t, dns, v1.IP.String())
	victims := []*cluster.Pod{v1, v2}
	vCluster := hostPort(web.Spec.ClusterIP, 80)
	vNodePort := hostPort(n1.IP.String(), web.Spec.Ports[0].NodePort)
	hcURL := fmt.Sprintf("http://%s/", hostPort(n1.IP.String(), lb.Spec.HealthCheckNodePort))
	e.waitOK(t, "victim cluster IP from node-2", client2.NS, "tcp", vCluster)
	e.waitOK(t, "victim DNS", client1.NS, "udp", hostPort(dns.Spec.ClusterIP, 53))
	victimUnmoved := func(t *testing.T, when string) {
		t.Helper()
		for _, cl := range []*cluster.Pod{client1, client2} {
			expectAnswered(t, fmt.Sprintf("%s: %s -> victim cluster IP %s", when, cl.Name, vCluster), e.probe(t, cl.NS, "tcp", vCluster, 10, time.Second), victims, nil)
		}
		expectAnswered(t, when+": client-2 -> victim pod "+v1.IP.String(), e.probe(t, client2.NS, "tcp", hostPort(v1.IP.String(), 8080), 4, time.Second), []*cluster.Pod{v1}, nil)
		expectAnswered(t, when+": client-1 -> victim pod "+v2.IP.String(), e.probe(t, client1.NS, "tcp", hostPort(v2.IP.String(), 8080), 4, time.Second), []*cluster.Pod{v2}, nil)
		expectAnswered(t, when+": external -> victim node port "+vNodePort, e.probe(t, c.ExternalNS, "tcp", vNodePort, 10, time.Second), victims, nil)
		code, body, err := c.HTTPGet(ctx, c.ExternalNS, hcURL)
		if err != nil || code != 200 || !strings.Contains(string(body), `"localEndpoints"`) {
			t.Errorf("%s: the victim's health check %s answered %d %q (%v), want nftproxy's 200 with localEndpoints", when, hcURL, code, body, err)
		}
	}
	victimUnmoved(t, "before")
	// creationTimestamp has one-second resolution: the tenant arrives at least a second
	// later
	if d := time.Until(dns.CreationTimestamp.Add(1100 * time.Millisecond)); d > 0 {
		time.Sleep(d)
	}

	e.run(t, "externalips-on-the-victims-pods", func(t *testing.T) {
		s := e.nsService(t, tenantNS, "pods", corev1.ServiceSpec{Ports: []corev1.ServicePort{tcpPort("http", 8080, 8080)},
			ExternalIPs: []string{v1.IP.String(), v2.IP.String()}})
		e.nsSlice(t, s, evil.IP.String())
		// both nodes programmed the tenant's Service: its own cluster IP answers
		e.waitOK(t, "the tenant's own cluster IP from node-1", client1.NS, "tcp", hostPort(s.Spec.ClusterIP, 8080))
		e.waitOK(t, "the tenant's own cluster IP from node-2", client2.NS, "tcp", hostPort(s.Spec.ClusterIP, 8080))
		victimUnmoved(t, "after externalIPs on the pods")
		e.waitEvent(t, "pods", "externalIP "+v1.IP.String()+" is inside the cluster CIDR")
		e.waitEvent(t, "pods", "externalIP "+v2.IP.String()+" is inside the cluster CIDR")
	})

	e.run(t, "externalip-on-the-node-ports", func(t *testing.T) {
		s := e.nsService(t, tenantNS, "ports", corev1.ServiceSpec{ExternalIPs: []string{n1.IP.String()},
			Ports: []corev1.ServicePort{tcpPort("np", web.Spec.Ports[0].NodePort, 8080), tcpPort("hc", lb.Spec.HealthCheckNodePort, 8080)}})
		e.nsSlice(t, s, evil.IP.String())
		e.waitOK(t, "the tenant's own cluster IP", client1.NS, "tcp", hostPort(s.Spec.ClusterIP, web.Spec.Ports[0].NodePort))
		victimUnmoved(t, "after externalIPs on the node ports")
		e.waitEvent(t, "ports", fmt.Sprintf("TCP port %d is a node port or health-check node port, refused", web.Spec.Ports[0].NodePort))
		e.waitEvent(t, "ports", fmt.Sprintf("TCP port %d is a node port or health-check node port, refused", lb.Spec.HealthCheckNodePort))
	})

	e.run(t, "udp-flows-survive-a-tenant-endpoint-change", func(t *testing.T) {
		s := e.nsService(t, tenantNS, "flip", corev1.ServiceSpec{Ports: []corev1.ServicePort{udpPort("dns", 53, 9090)},
			ExternalIPs: []string{dns.Spec.ClusterIP}})
		e.nsSlice(t, s, v1.IP.String(), evil.IP.String())                                    // the victim's DNS pod, as the tenant's endpoint
		e.waitEvent(t, "flip", "externalIP "+dns.Spec.ClusterIP+" is a cluster IP, refused") // refused before, too
		dnsAddr := hostPort(dns.Spec.ClusterIP, 53)
		const sport = 41153
		res, err := c.Probe(ctx, client1.NS, cluster.ProbeSpec{Proto: "udp", Addr: dnsAddr, SourcePort: sport})
		if err != nil || len(res) != 1 || !res[0].OK || res[0].Pod != v1.Name {
			t.Fatalf("DNS query from port %d: %+v %v", sport, res, err)
		}
		entry := fmt.Sprintf("dst=%s sport=%d dport=53", dns.Spec.ClusterIP, sport)
		hasEntry := func() (bool, string) {
			out, err := c.Exec(ctx, n1.NS, "conntrack", "-L", "-p", "udp")
			if err != nil {
				t.Fatalf("conntrack -L: %v\n%s", err, out)
			}
			return strings.Contains(string(out), entry), string(out)
		}
		if ok, out := hasEntry(); !ok {
			t.Fatalf("no conntrack entry %q after the query:\n%s", entry, out)
		}
		// the tenant drops the DNS pod from its endpoints; its own cluster IP then
		// answers from its pod alone, so both nodes have synced the change
		sl, err := c.Client.DiscoveryV1().EndpointSlices(tenantNS).Get(ctx, "flip-e2e", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		sl.Endpoints = []discoveryv1.Endpoint{sl.Endpoints[1]}
		if _, err := c.Client.DiscoveryV1().EndpointSlices(tenantNS).Update(ctx, sl, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		tenantAddr := hostPort(s.Spec.ClusterIP, 53)
		e.eventually(t, "the tenant's cluster IP answers from its own pod only", func() []cluster.ProbeResult {
			return e.probe(t, client1.NS, "udp", tenantAddr, 6, 500*time.Millisecond)
		}, func(res []cluster.ProbeResult) bool {
			for _, r := range res {
				if !r.OK || r.Pod != evil.Name {
					return false
				}
			}
			return true
		})
		time.Sleep(2 * time.Second) // the cleanup runs right after the sync's commit
		if ok, out := hasEntry(); !ok {
			t.Errorf("the victim's DNS conntrack entry %q was deleted by the tenant's endpoint change:\n%s", entry, out)
		}
	})

	e.run(t, "events-name-no-other-namespace", func(t *testing.T) {
		evs, err := c.Client.CoreV1().Events(tenantNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs.Items {
			if ev.Reason == "NftproxyIgnored" && (strings.Contains(ev.Message, victimNS) || strings.Contains(ev.Message, "web") || strings.Contains(ev.Message, "dns")) {
				t.Errorf("event on %s names the other namespace's service: %s", ev.InvolvedObject.Name, ev.Message)
			}
		}
	})
	victimUnmoved(t, "at the end")
	if !p2.Running() {
		t.Errorf("nftproxy on node-2 exited; log:\n%s", p2.Tail(40))
	}
}
