package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/nftproxy/nftproxy/e2e/cluster"
)

// TestBeyondKubeProxy runs nftproxy's opt-in options that kube-proxy lacks, with real
// packets: --no-masquerade-cidrs (one pod's address listed, the others not, so each
// subtest has its kube-proxy control in the same run), --udp-keep-terminating-flows and,
// after a restart, --masquerade-to-node-ip.
func TestBeyondKubeProxy(t *testing.T) {
	cluster.Require(t)
	e := newEnv(t, 3)
	c := e.c
	e.setupRoutes(t)
	kept := e.web[0] // its address is in --no-masquerade-cidrs
	e.startProxy(t, c.LeastPrivilegeKubeconfigT(t), append(cluster.WatchedFlags,
		"--no-masquerade-cidrs="+kept.IP.String()+"/32", "--udp-keep-terminating-flows")...)

	e.run(t, "no-masquerade-cidrs", func(t *testing.T) {
		svcKept := e.createService(t, "nomasq-kept", corev1.ServiceTypeNodePort, nil, tcpPort("http", 80, 8080))
		e.putSlice(t, svcKept, endpoint(kept, ready))
		svcMasq := e.createService(t, "nomasq-control", corev1.ServiceTypeNodePort, nil, tcpPort("http", 80, 8080))
		e.putSlice(t, svcMasq, endpoint(e.web[1], ready))
		keptAddr, masqAddr := hostPort(svcKept.Spec.ClusterIP, 80), hostPort(svcMasq.Spec.ClusterIP, 80)

		// node -> service -> pod: kube-proxy masquerades (the pod sees the node's address
		// on the pod link); to a listed destination the node's own source address stays.
		e.waitOK(t, "listed endpoint answers from the node", c.NodeNS, "tcp", keptAddr)
		expectAnswered(t, "node -> "+keptAddr+" (listed: source kept)", e.probe(t, c.NodeNS, "tcp", keptAddr, 10, time.Second),
			[]*cluster.Pod{kept}, is(c.NodeIP.String()))
		e.waitOK(t, "control answers from the node", c.NodeNS, "tcp", masqAddr)
		expectAnswered(t, "node -> "+masqAddr+" (not listed: masqueraded)", e.probe(t, c.NodeNS, "tcp", masqAddr, 10, time.Second),
			[]*cluster.Pod{e.web[1]}, isNot(c.NodeIP.String()))

		// external client -> node port: masqueraded by kube-proxy (Cluster policy); the
		// listed destination sees the client itself.
		np := func(svc *corev1.Service) string { return hostPort(c.NodeIP.String(), svc.Spec.Ports[0].NodePort) }
		e.waitOK(t, "listed node port answers", c.ExternalNS, "tcp", np(svcKept))
		expectAnswered(t, "external -> node port of "+svcKept.Name+" (listed: source kept)", e.probe(t, c.ExternalNS, "tcp", np(svcKept), 10, time.Second),
			[]*cluster.Pod{kept}, is(c.ExternalIP.String()))
		expectAnswered(t, "external -> node port of "+svcMasq.Name+" (not listed: masqueraded)", e.probe(t, c.ExternalNS, "tcp", np(svcMasq), 10, time.Second),
			[]*cluster.Pod{e.web[1]}, isNot(c.ExternalIP.String()))

		// hairpin: the listed pod reaching itself through its Service is still
		// masqueraded (else it would answer itself from its own address).
		e.waitOK(t, "hairpin answers", kept.NS, "tcp", keptAddr)
		expectAnswered(t, kept.Name+" -> "+keptAddr+" -> itself (masqueraded)", e.probe(t, kept.NS, "tcp", keptAddr, 5, time.Second),
			[]*cluster.Pod{kept}, isNot(kept.IP.String()))
	})

	e.run(t, "udp-keep-terminating-flows", func(t *testing.T) {
		s := &sem{c: c, proxies: map[string]*cluster.Process{"node-1": e.proxy}}
		a, b := e.web[1], e.web[2]
		svc := e.createService(t, "udp-drain", corev1.ServiceTypeClusterIP, nil, udpPort("sip", 5060, 9090))
		e.putSlice(t, svc, endpoint(a, ready))
		addr := hostPort(svc.Spec.ClusterIP, 5060)
		e.waitOK(t, "udp service answers", e.client.NS, "udp", addr)

		const sport = 45060
		run := s.startStream(t, e.client, addr, sport)
		s.waitStream(t, run, time.Time{}, "5 answers in a row from "+a.Name, func(res []cluster.ProbeResult) bool {
			return len(res) >= 5 && only(a)(res[len(res)-5:])
		})
		// a terminates and no longer passes its readiness probe (serving=false); b is
		// ready. kube-proxy deletes the flow's conntrack entry now (the stream moves to b);
		// with the option the flow stays on a while a is in the slice.
		stopping := endpoint(a, ready)
		stopping.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(true)}
		t0 := time.Now()
		e.putSlice(t, svc, stopping, endpoint(b, ready))
		// New flows go to b only once the proxy has synced the change.
		e.eventually(t, "new flows go to "+b.Name, func() []cluster.ProbeResult {
			return e.probe(t, e.client.NS, "udp", addr, 4, time.Second)
		}, only(b))
		time.Sleep(3 * time.Second) // a sync and its conntrack cleanup are long done
		res := run.Results()
		var after []cluster.ProbeResult
		for _, r := range res {
			if r.At.After(t0) {
				after = append(after, r)
			}
		}
		if len(after) < 10 || !only(a)(after) {
			t.Fatalf("the flow left its terminating endpoint %s while it was in the slice (want every answer from it): %s", a.Name, timeline(res, t0))
		}
		t.Logf("while %s terminates: %s", a.Name, timeline(after, t0))
		// a leaves the slice: now the flow moves.
		s.streamMovesTo(t, run, b, e.client.IP.String()+":"+fmt.Sprint(sport), func() { e.putSlice(t, svc, endpoint(b, ready)) })
	})

	e.run(t, "masquerade-to-node-ip", func(t *testing.T) {
		// kube-proxy's masquerade: the node's address on the pod link. With the option,
		// restarted: the node's primary IP (its InternalIP), and hairpin traffic still
		// masqueraded.
		svc := e.createService(t, "snat-node-ip", corev1.ServiceTypeNodePort, nil, tcpPort("http", 80, 8080))
		target := e.web[2]
		e.putSlice(t, svc, endpoint(target, ready))
		np := hostPort(c.NodeIP.String(), svc.Spec.Ports[0].NodePort)
		e.waitOK(t, "node port answers", c.ExternalNS, "tcp", np)
		expectAnswered(t, "external -> node port (masqueraded to the pod link's address)", e.probe(t, c.ExternalNS, "tcp", np, 5, time.Second),
			[]*cluster.Pod{target}, isNot(c.ExternalIP.String(), c.NodeIP.String()))
		e.proxy.Stop()
		e.startProxy(t, c.LeastPrivilegeKubeconfigT(t), append(cluster.WatchedFlags,
			"--no-masquerade-cidrs="+kept.IP.String()+"/32", "--udp-keep-terminating-flows", "--masquerade-to-node-ip")...)
		e.eventually(t, "external -> node port source-NATed to the node's IP", func() []cluster.ProbeResult {
			return e.probe(t, c.ExternalNS, "tcp", np, 5, time.Second)
		}, func(res []cluster.ProbeResult) bool {
			for _, r := range res {
				if !r.OK || clientHost(r) != c.NodeIP.String() {
					return false
				}
			}
			return true
		})
		addr := hostPort(svc.Spec.ClusterIP, 80)
		e.waitOK(t, "hairpin answers", target.NS, "tcp", addr)
		expectAnswered(t, target.Name+" -> "+addr+" -> itself (masqueraded)", e.probe(t, target.NS, "tcp", addr, 5, time.Second),
			[]*cluster.Pod{target}, isNot(target.IP.String()))
	})

	e.run(t, "nft-list-shows-options", func(t *testing.T) {
		out, err := e.nftList(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"ip daddr " + kept.IP.String() + " return", "snat to " + c.NodeIP.String() + " fully-random"} {
			if !strings.Contains(out, want) {
				t.Errorf("no %q in the masquerading chain:\n%s", want, out)
			}
		}
	})
}

// lbMaglev is the Maglev test's load-balancer IP, routed by the external client to
// node-1 or node-2 in turn (an ECMP router moving the same flows between nodes).
const lbMaglev = "198.51.100.60"

// TestMaglev: a Service annotated nftproxy.io/load-balancing: maglev, ten endpoints on
// two nodes, each node running its own nftproxy. The same 10,000 flows (client address
// and source port) sent through either node reach the same endpoints, with no state
// shared between the nodes; after one endpoint is removed, the same flows started anew
// move only if they were on it, or about 1 % beyond that (at most 12 % in all; a random
// choice moves about 90 %).
func TestMaglev(t *testing.T) {
	cluster.Require(t)
	s := &sem{bin: buildNftproxy(t), proxies: map[string]*cluster.Process{}, pods: map[string]*cluster.Pod{}}
	s.c = cluster.StartT(t, cluster.Config{})
	c, ctx := s.c, t.Context()
	s.n1 = c.Node(c.NodeName)
	var err error
	if s.n2, err = c.AddNode(ctx, "node-2"); err != nil {
		t.Fatal(err)
	}
	var pods []*cluster.Pod
	for i := range 10 {
		n := s.n1
		if i%2 == 1 {
			n = s.n2
		}
		p, err := c.AddPodOn(ctx, n, fmt.Sprintf("mg-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		pods = append(pods, p)
	}
	s.startProxies(t)
	svc := s.createService(t, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "maglev", Annotations: map[string]string{"nftproxy.io/load-balancing": "maglev"}},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{udpPort("sip", 5060, 9090)}},
	})
	s.setIngress(t, svc, lbMaglev)
	var eps []discoveryv1.Endpoint
	for _, p := range pods {
		eps = append(eps, s.ep(p, ready))
	}
	s.put4(t, svc, eps...)
	addr := hostPort(lbMaglev, 5060)
	via := func(n *cluster.Node) {
		s.mustExec(t, c.ExternalNS, "ip", "route", "replace", lbMaglev+"/32", "via", n.IP.String())
	}
	via(s.n1)
	s.waitFor(t, "the load-balancer IP answers through node-1", c.ExternalNS, "udp", addr, allOK)
	via(s.n2)
	s.waitFor(t, "the load-balancer IP answers through node-2", c.ExternalNS, "udp", addr, allOK)

	const flows, firstPort = 10000, 20000
	// round sends one datagram per flow and returns the pod that answered each ("" for
	// none); conntrack is flushed first on both nodes, so every flow is new there and
	// picked by the ruleset.
	round := func(what string, n *cluster.Node) []string {
		t.Helper()
		for _, m := range []*cluster.Node{s.n1, s.n2} {
			s.mustExec(t, m.NS, "conntrack", "-F")
		}
		via(n)
		start := time.Now()
		res, err := c.Probe(ctx, c.ExternalNS, cluster.ProbeSpec{Proto: "udp", Addr: addr, Count: flows, Timeout: 500 * time.Millisecond,
			SourcePort: firstPort, SourcePortEach: true})
		if err != nil {
			t.Fatal(err)
		}
		out, lost := make([]string, flows), 0
		for i, r := range res {
			if r.OK {
				out[i] = r.Pod
			} else {
				lost++
			}
		}
		t.Logf("%s: %d flows through %s in %v, %d unanswered, per endpoint %s", what, flows, n.Name, time.Since(start).Round(time.Millisecond), lost, fmtCounts(count(out)))
		if lost > flows/100 {
			t.Fatalf("%s: %d of %d flows unanswered", what, lost, flows)
		}
		return out
	}
	differ := func(a, b []string) (n, both int) {
		for i := range a {
			if a[i] != "" && b[i] != "" {
				both++
				if a[i] != b[i] {
					n++
				}
			}
		}
		return n, both
	}

	one := round("node-1", s.n1)
	two := round("node-2", s.n2)
	if n, both := differ(one, two); n != 0 {
		t.Errorf("%d of %d flows reached another endpoint through node-2 than through node-1", n, both)
	}
	for pod, k := range count(one) {
		if k < flows/10*7/10 || k > flows/10*13/10 {
			t.Errorf("endpoint %s got %d of %d flows, want about a tenth", pod, k, flows)
		}
	}

	gone := pods[3]
	s.put4(t, svc, slices.Delete(slices.Clone(eps), 3, 4)...)
	for _, n := range []*cluster.Node{s.n1, s.n2} { // both proxies have synced the removal
		via(n)
		s.waitFor(t, "no new flow through "+n.Name+" reaches "+gone.Name, c.ExternalNS, "udp", addr, func(res []cluster.ProbeResult) bool {
			for _, r := range res {
				if !r.OK || r.Pod == gone.Name {
					return false
				}
			}
			return true
		})
	}
	after := round("node-1 without "+gone.Name, s.n1)
	moved, both := differ(one, after)
	wasOnGone := count(one)[gone.Name]
	frac := float64(moved) / float64(both)
	t.Logf("one of 10 endpoints removed: %d of %d flows moved (%.1f %%), %d of them were on %s", moved, both, 100*frac, wasOnGone, gone.Name)
	if frac > 0.12 {
		t.Errorf("%.1f %% of flows moved after removing one of 10 endpoints, want at most 12 %%", 100*frac)
	}
	for i := range one {
		if one[i] == gone.Name && after[i] == gone.Name {
			t.Fatalf("flow %d still reached the removed endpoint %s", i, gone.Name)
		}
	}
}

// count tallies answers per pod ("" left out).
func count(pods []string) map[string]int {
	m := map[string]int{}
	for _, p := range pods {
		if p != "" {
			m[p]++
		}
	}
	return m
}
