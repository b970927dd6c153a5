package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"

	"github.com/nftproxy/nftproxy/e2e/cluster"
)

// TestBeyondKubeProxy runs nftproxy's opt-in options that kube-proxy lacks, with real
// packets: --no-masquerade-cidrs (one pod's address listed, the others not, so each
// subtest has its kube-proxy control in the same run) and --udp-keep-terminating-flows.
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
		time.Sleep(2 * time.Second) // a sync and its conntrack cleanup are long done
		res := run.Results()
		var after []cluster.ProbeResult
		for _, r := range res {
			if r.At.After(t0) {
				after = append(after, r)
			}
		}
		if len(after) < 20 || !only(a)(after) {
			t.Fatalf("the flow left its terminating endpoint %s while it was in the slice (want every answer from it): %s", a.Name, timeline(res, t0))
		}
		t.Logf("while %s terminates: %s", a.Name, timeline(after, t0))
		// a leaves the slice: now the flow moves.
		s.streamMovesTo(t, run, b, e.client.IP.String()+":"+fmt.Sprint(sport), func() { e.putSlice(t, svc, endpoint(b, ready)) })
	})

	e.run(t, "nft-list-shows-options", func(t *testing.T) {
		out, err := e.nftList(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if want := "ip daddr " + kept.IP.String() + " return"; !strings.Contains(out, want) {
			t.Errorf("no %q in the masquerading chain:\n%s", want, out)
		}
	})
}
