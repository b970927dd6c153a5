package e2e

// TestHostileTenantBudget: a tenant fills the table's element budget
// (--max-table-elements, small here so that the run is quick) before the first
// namespace creates its next Service. On a real apiserver with real packets: the
// first namespace's new Service and its Helm-style re-created one are programmed, the
// tenant's newest Service is the one set aside, and the tenant's event discloses
// nothing about the other namespace or the budget.
//
//	NFTPROXY_E2E=1 go test ./e2e/ -count=1 -v -run '^TestHostileTenantBudget$'

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/e2e/cluster"
	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/model"
)

// budgetElements is the --max-table-elements of the test's nftproxy.
const budgetElements = 2000

// costOfService is compile.ElementCost summed over a ClusterIP Service of ports ports
// with n endpoints each: what the budget charges for it.
func costOfService(ports, n int) int {
	sp := model.ServicePort{ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1")}, Port: 80,
		Endpoints: make([]model.Endpoint, n)}
	return ports * compile.ElementCost(&sp)
}

func TestHostileTenantBudget(t *testing.T) {
	cluster.Require(t)
	e := &env{bin: buildNftproxy(t)}
	e.c = cluster.StartT(t, cluster.Config{})
	c := e.c
	pod := func(name string) *cluster.Pod {
		p, err := c.AddPod(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	v1, client := pod("victim-1"), pod("client")
	e.client = client
	for _, n := range []string{victimNS, tenantNS} {
		if _, err := c.Client.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	e.startProxy(t, c.LeastPrivilegeKubeconfigT(t), append([]string{"--max-table-elements", fmt.Sprint(budgetElements)}, cluster.WatchedFlags...)...)
	// a second passes between the phases: creationTimestamp has one-second resolution
	later := func(after *corev1.Service) {
		if d := time.Until(after.CreationTimestamp.Add(1100 * time.Millisecond)); d > 0 {
			time.Sleep(d)
		}
	}
	victimService := func(name string) *corev1.Service {
		s := e.nsService(t, victimNS, name, corev1.ServiceSpec{Ports: []corev1.ServicePort{tcpPort("http", 80, 8080)}})
		e.nsSlice(t, s, v1.IP.String())
		return s
	}
	web := victimService("web")
	e.waitOK(t, "victim web", client.NS, "tcp", hostPort(web.Spec.ClusterIP, 80))
	later(web)

	// The tenant: two Services of 9 ports × 50 endpoints (as the attack's 99 ports ×
	// 10,000, scaled to the budget), then a top-up that leaves less room than the
	// victim's next Service needs. The endpoints are addresses nobody answers on: only
	// their count matters.
	var fill []*corev1.Service
	tenantService := func(name string, ports, n int) *corev1.Service {
		var sp []corev1.ServicePort
		for p := range int32(ports) {
			sp = append(sp, tcpPort(fmt.Sprintf("p%d", p), 1000+p, 8080))
		}
		s := e.nsService(t, tenantNS, name, corev1.ServiceSpec{Ports: sp})
		var addrs []string
		for i := range n {
			addrs = append(addrs, fmt.Sprintf("10.250.%d.%d", i/250, 1+i%250))
		}
		e.nsSlice(t, s, addrs...)
		return s
	}
	e.run(t, "tenant-fills-the-budget", func(t *testing.T) {
		// what the Services already there cost (web, and the apiserver's own kubernetes
		// Service), then the fills
		left := budgetElements - e.clusterCost(t) - 2*costOfService(9, 50)
		fill = append(fill, tenantService("fill-a", 9, 50), tenantService("fill-b", 9, 50))
		n := 0 // the top-up's endpoints: the most that fit
		for costOfService(1, n+1) <= left {
			n++
		}
		if n == 0 || left-costOfService(1, n) >= costOfService(1, 1) {
			t.Fatalf("cannot size the top-up: %d elements left, a 1-port Service costs %d + per endpoint", left, costOfService(1, 0))
		}
		later(fill[1])
		fill = append(fill, tenantService("top-up", 1, n))
		t.Logf("the tenant's Services cost %d elements of %d; %d are left, less than the %d of a one-endpoint Service",
			2*costOfService(9, 50)+costOfService(1, n), budgetElements, left-costOfService(1, n), costOfService(1, 1))
		if c := e.clusterCost(t); c != budgetElements-(left-costOfService(1, n)) {
			t.Fatalf("the cluster's Services cost %d, want %d", c, budgetElements-(left-costOfService(1, n)))
		}
		// everything fits so far: the top-up is programmed, nothing is set aside, and the
		// victim still answers
		e.waitIn(t, fill[2].Spec.ClusterIP)
		for _, ns := range []string{victimNS, tenantNS} {
			for _, ev := range e.nsEvents(t, ns) {
				t.Fatalf("before the budget is exceeded, an event on %s/%s: %s", ns, ev.InvolvedObject.Name, ev.Message)
			}
		}
		e.waitOK(t, "victim web", client.NS, "tcp", hostPort(web.Spec.ClusterIP, 80))
	})

	if t.Failed() {
		return
	}
	var api *corev1.Service
	e.run(t, "a-later-service-in-another-namespace-is-programmed", func(t *testing.T) {
		later(fill[2])
		api = victimService("api")
		e.waitOK(t, "victim api, created after the tenant filled the budget", client.NS, "tcp", hostPort(api.Spec.ClusterIP, 80))
		e.waitOK(t, "victim web", client.NS, "tcp", hostPort(web.Spec.ClusterIP, 80))
		// the tenant's newest Service made room, and its oldest kept its place
		e.waitEvent(t, "top-up", "share of the table's element budget")
		table, err := e.nftList(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if !inTable(table, fill[0].Spec.ClusterIP) {
			t.Errorf("the tenant's oldest Service (fill-a, %s) is not in the table", fill[0].Spec.ClusterIP)
		}
		if inTable(table, fill[2].Spec.ClusterIP) {
			t.Errorf("the tenant's set-aside Service (top-up, %s) is in the table", fill[2].Spec.ClusterIP)
		}
	})

	e.run(t, "helm-recreated-service-is-programmed-again", func(t *testing.T) {
		// a Helm upgrade that replaces the Service: deleted and created again, now the
		// newest Service of all
		if err := c.Client.CoreV1().Services(victimNS).Delete(t.Context(), "web", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := c.Client.DiscoveryV1().EndpointSlices(victimNS).Delete(t.Context(), "web-e2e", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		e.waitGone(t, web.Spec.ClusterIP)
		later(api)
		web = victimService("web")
		e.waitOK(t, "victim web, re-created", client.NS, "tcp", hostPort(web.Spec.ClusterIP, 80))
		e.waitOK(t, "victim api", client.NS, "tcp", hostPort(api.Spec.ClusterIP, 80))
	})

	e.run(t, "events-disclose-nothing", func(t *testing.T) {
		for _, ev := range e.nsEvents(t, victimNS) {
			t.Errorf("event on the victim's %s: %s", ev.InvolvedObject.Name, ev.Message)
		}
		n := 0
		for _, ev := range e.nsEvents(t, tenantNS) {
			n++
			for _, secret := range []string{victimNS, "web", "api", fmt.Sprint(budgetElements), "older"} {
				if strings.Contains(ev.Message, secret) {
					t.Errorf("the tenant's event on %s discloses %q: %s", ev.InvolvedObject.Name, secret, ev.Message)
				}
			}
		}
		if n == 0 {
			t.Errorf("no NftproxyIgnored event in %s", tenantNS)
		}
	})
}

// nsEvents returns nftproxy's NftproxyIgnored events in namespace ns.
func (e *env) nsEvents(t *testing.T, ns string) []corev1.Event {
	t.Helper()
	evs, err := e.c.Client.CoreV1().Events(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Event
	for _, ev := range evs.Items {
		if ev.Reason == "NftproxyIgnored" {
			out = append(out, ev)
		}
	}
	return out
}

// inTable reports whether a frontend at the address is in the listed table (keys read
// "10.96.0.10 . tcp . 80").
func inTable(table, addr string) bool { return strings.Contains(table, " "+addr+" . ") }

// clusterCost is compile.ElementCost summed over the cluster's Services, from the API:
// per port its cluster IPs and node port, and the endpoints its slices give that port.
func (e *env) clusterCost(t *testing.T) int {
	t.Helper()
	svcs, err := e.c.Client.CoreV1().Services("").List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	slices, err := e.c.Client.DiscoveryV1().EndpointSlices("").List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, s := range svcs.Items {
		for _, p := range s.Spec.Ports {
			sp := model.ServicePort{NodePort: uint16(p.NodePort)}
			for _, ip := range s.Spec.ClusterIPs {
				if a, err := netip.ParseAddr(ip); err == nil {
					sp.ClusterIPs = append(sp.ClusterIPs, a)
				}
			}
			for _, sl := range slices.Items {
				if sl.Namespace != s.Namespace || sl.Labels[discoveryv1.LabelServiceName] != s.Name {
					continue
				}
				for _, sport := range sl.Ports {
					if sport.Name != nil && *sport.Name == p.Name {
						sp.Endpoints = append(sp.Endpoints, make([]model.Endpoint, len(sl.Endpoints))...)
					}
				}
			}
			n += compile.ElementCost(&sp)
		}
	}
	return n
}

// waitGone waits until the address is no longer in nftproxy's table.
func (e *env) waitGone(t *testing.T, addr string) {
	t.Helper()
	e.waitTable(t, addr+" gone", func(table string) bool { return !inTable(table, addr) })
}

// waitIn waits until the address is in nftproxy's table.
func (e *env) waitIn(t *testing.T, addr string) {
	t.Helper()
	e.waitTable(t, addr, func(table string) bool { return inTable(table, addr) })
}
