// Package e2e holds nftproxy's end-to-end service tests: one throw-away cluster
// (e2e/cluster) with nftproxy running in the node namespace, and one subtest per
// behaviour of ../shared/spec/semantics.md that can be observed with real packets.
//
//	NFTPROXY_E2E=1 go test ./e2e/ -count=1 -v
package e2e

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/nftproxy/nftproxy/e2e/cluster"
)

const (
	ns          = "default"
	clusterCIDR = "10.244.0.0/16"
	tableName   = "nftproxy"
	// converge bounds every wait for the proxy to apply an API change
	// (--min-sync-period is 100ms).
	converge = 10 * time.Second
	// Off-cluster addresses the external client reaches through the node.
	externalIP = "203.0.113.10"
	lbIP       = "198.51.100.10"
)

// env is the state shared by the subtests of TestServices.
type env struct {
	c      *cluster.Cluster
	bin    string   // nftproxy binary
	args   []string // its arguments
	proxy  *cluster.Process
	web    []*cluster.Pod // web-1..3: endpoints
	client *cluster.Pod   // a pod that is never an endpoint
	svcs   []string       // names of the services created so far (all in ns)
}

// TestServices runs the whole suite against one cluster and one nftproxy process. The
// subtests run in order and share the cluster, but each one creates its own services,
// so a failing subtest does not stop the others.
func TestServices(t *testing.T) {
	cluster.Require(t)
	e := newEnv(t, 3)
	c := e.c
	e.setupRoutes(t)

	e.startProxy(t, c.LeastPrivilegeKubeconfigT(t), cluster.WatchedFlags...)

	e.run(t, "clusterip-sources", e.testClusterIPSources)    // a
	e.run(t, "port-to-targetport", e.testTargetPort)         // b
	e.run(t, "multi-port-tcp-udp", e.testMultiPort)          // c
	e.run(t, "nodeport", e.testNodePort)                     // d
	e.run(t, "external-ip", e.testExternalIP)                // e
	e.run(t, "loadbalancer-ingress-ip", e.testLoadBalancer)  // f
	e.run(t, "no-endpoints-rejected", e.testNoEndpoints)     // g
	e.run(t, "endpoints-change", e.testEndpointsChange)      // h
	e.run(t, "not-ready-endpoints-unused", e.testNotReady)   // i
	e.run(t, "hairpin", e.testHairpin)                       // j
	e.run(t, "undefined-port-rejected", e.testUndefinedPort) // k
	e.run(t, "nft-list-table", e.testNftList)                // m (all services present)
	e.run(t, "dry-run", e.testDryRun)                        // --dry-run prints the ruleset
	e.run(t, "metrics", e.testMetrics)                       // counters after known traffic
	e.run(t, "metrics-upstream", e.testUpstreamMetrics)      // kube-proxy's pages and metrics, verify via /configz
	e.run(t, "explain", e.testExplain)                       // explain against the live API
	e.run(t, "service-deleted", e.testServiceDeleted)        // l
	e.run(t, "kill-9-restart-no-failed-connection", e.testRestart)
	t.Run("sigterm-keeps-rules-cleanup-removes", e.testCleanup) // n (stops nftproxy)
}

// buildNftproxy builds ./cmd/nftproxy (from the repository root) into a temp dir.
// newEnv builds nftproxy, starts a local cluster and adds pods web-1 … web-<webs> and
// client on its first node.
func newEnv(t *testing.T, webs int) *env {
	t.Helper()
	e := &env{bin: buildNftproxy(t)}
	e.c = cluster.StartT(t, cluster.Config{})
	for i := 1; i <= webs+1; i++ {
		name := fmt.Sprintf("web-%d", i)
		if i > webs {
			name = "client"
		}
		p, err := e.c.AddPod(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		if name == "client" {
			e.client = p
		} else {
			e.web = append(e.web, p)
		}
	}
	return e
}

func buildNftproxy(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "nftproxy")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	if err := cluster.BuildNftproxy(ctx, bin); err != nil {
		t.Fatal(err)
	}
	return bin
}

// startProxy starts nftproxy in node-1's namespace with the kubeconfig, the cluster CIDR
// and extra flags (kept in e.args), and waits for its first sync.
func (e *env) startProxy(t *testing.T, kubeconfig string, extra ...string) {
	t.Helper()
	e.args = cluster.NftproxyArgs(kubeconfig, e.c.NodeName, clusterCIDR, extra...)
	var err error
	if e.proxy, err = e.c.StartProcess(e.c.NodeNS, "nftproxy", append([]string{e.bin}, e.args...)...); err != nil {
		t.Fatal(err)
	}
	e.waitFirstSync(t)
}

// setupRoutes routes the external-IP and LB ranges from the external client to the
// node. (The node itself needs no extra route: like a real node it has a default route,
// via the external client.) Only the harness's namespaces are touched.
func (e *env) setupRoutes(t *testing.T) {
	t.Helper()
	ctx, c := t.Context(), e.c
	for _, r := range []struct {
		ns   string
		args []string
	}{
		{c.ExternalNS, []string{"route", "add", "203.0.113.0/24", "via", c.NodeIP.String()}},
		{c.ExternalNS, []string{"route", "add", "198.51.100.0/24", "via", c.NodeIP.String()}},
	} {
		if out, err := c.Exec(ctx, r.ns, append([]string{"ip"}, r.args...)...); err != nil {
			t.Fatalf("ip %s in %s: %v: %s", strings.Join(r.args, " "), r.ns, err, out)
		}
	}
}

// waitFirstSync waits until nftproxy has logged a sync and its table exists.
func (e *env) waitFirstSync(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if !e.proxy.Running() {
			t.Fatalf("nftproxy exited before its first sync; log:\n%s", e.proxy.Tail(40))
		}
		synced := strings.Contains(strings.ToLower(e.proxy.Tail(200)), "sync")
		if _, err := e.nftList(t.Context()); synced && err == nil {
			return
		}
		if time.Now().After(deadline) {
			out, err := e.nftList(t.Context())
			t.Fatalf("nftproxy: no sync within 60s (table: %v %s); log:\n%s", err, out, e.proxy.Tail(40))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// run runs one subtest; on failure it logs the table and the tail of nftproxy's log.
func (e *env) run(t *testing.T, name string, f func(t *testing.T)) {
	t.Run(name, func(t *testing.T) {
		if !e.proxy.Running() {
			t.Fatalf("nftproxy is not running; log:\n%s", e.proxy.Tail(40))
		}
		t.Cleanup(func() {
			if !t.Failed() {
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			out, err := e.nftList(ctx)
			t.Logf("nft list table ip %s (err %v):\n%s", tableName, err, out)
			t.Logf("nftproxy log tail:\n%s", e.proxy.Tail(20))
		})
		f(t)
	})
}

// --- API helpers ---------------------------------------------------------------------

func tcpPort(name string, port, target int32) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Protocol: corev1.ProtocolTCP, Port: port, TargetPort: intstr.FromInt32(target)}
}

func udpPort(name string, port, target int32) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Protocol: corev1.ProtocolUDP, Port: port, TargetPort: intstr.FromInt32(target)}
}

// slicePorts returns the EndpointSlice ports matching the service ports (by name).
func slicePorts(ports ...corev1.ServicePort) []discoveryv1.EndpointPort {
	var out []discoveryv1.EndpointPort
	for _, p := range ports {
		out = append(out, discoveryv1.EndpointPort{
			Name: ptr.To(p.Name), Protocol: ptr.To(p.Protocol), Port: ptr.To(p.TargetPort.IntVal)})
	}
	return out
}

// createService creates a selector-less service in ns; the apiserver allocates the
// ClusterIP and node ports, and the returned object carries them.
func (e *env) createService(t *testing.T, name string, typ corev1.ServiceType, externalIPs []string, ports ...corev1.ServicePort) *corev1.Service {
	t.Helper()
	svc, err := e.c.Client.CoreV1().Services(ns).Create(t.Context(), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.ServiceSpec{Type: typ, Ports: ports, ExternalIPs: externalIPs},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create service %s: %v", name, err)
	}
	e.svcs = append(e.svcs, name)
	t.Logf("service %s/%s: clusterIP %s, ports %s", ns, name, svc.Spec.ClusterIP, portsString(svc))
	return svc
}

func portsString(svc *corev1.Service) string {
	var s []string
	for _, p := range svc.Spec.Ports {
		x := fmt.Sprintf("%s %s/%d->%s", p.Name, p.Protocol, p.Port, p.TargetPort.String())
		if p.NodePort != 0 {
			x += fmt.Sprintf(" nodePort %d", p.NodePort)
		}
		s = append(s, x)
	}
	return strings.Join(s, ", ")
}

type endpointState int

const (
	ready       endpointState = iota
	notReady                  // ready=false, serving=false
	terminating               // ready=false, serving=true, terminating=true
)

func endpoint(p *cluster.Pod, st endpointState) discoveryv1.Endpoint {
	cond := discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}
	switch st {
	case notReady:
		cond = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(false)}
	case terminating:
		cond = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}
	}
	return discoveryv1.Endpoint{
		Addresses:  []string{p.IP.String()},
		Conditions: cond,
		NodeName:   ptr.To("node-1"),
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: p.Name},
	}
}

// putSlice creates or replaces the EndpointSlice "<svc>-e2e" of service svc.
func (e *env) putSlice(t *testing.T, svc *corev1.Service, eps ...discoveryv1.Endpoint) {
	t.Helper()
	if eps == nil {
		eps = []discoveryv1.Endpoint{}
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:      svc.Name + "-e2e",
			Namespace: svc.Namespace,
			Labels:    map[string]string{discoveryv1.LabelServiceName: svc.Name, discoveryv1.LabelManagedBy: "e2e"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
		Ports:       slicePorts(svc.Spec.Ports...),
	}
	upsertSlice(t, e.c, slice)
}

// upsertSlice creates the slice or replaces the existing one of that name.
func upsertSlice(t *testing.T, c *cluster.Cluster, slice *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	t.Helper()
	api := c.Client.DiscoveryV1().EndpointSlices(slice.Namespace)
	var out *discoveryv1.EndpointSlice
	old, err := api.Get(t.Context(), slice.Name, metav1.GetOptions{})
	if err == nil {
		slice.ResourceVersion = old.ResourceVersion
		out, err = api.Update(t.Context(), slice, metav1.UpdateOptions{})
	} else {
		out, err = api.Create(t.Context(), slice, metav1.CreateOptions{})
	}
	if err != nil {
		t.Fatalf("endpoint slice %s: %v", slice.Name, err)
	}
	return out
}

// --- traffic helpers -----------------------------------------------------------------

func (e *env) probe(t *testing.T, from string, proto, addr string, count int, timeout time.Duration) []cluster.ProbeResult {
	t.Helper()
	return runProbe(t, e.c, from, proto, addr, count, timeout)
}

// runProbe runs count attempts from the namespace from, failing the test on an error of
// the probe itself (not of the attempts).
func runProbe(t *testing.T, c *cluster.Cluster, from, proto, addr string, count int, timeout time.Duration) []cluster.ProbeResult {
	t.Helper()
	res, err := c.Probe(t.Context(), from, cluster.ProbeSpec{Proto: proto, Addr: addr, Count: count, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// eventually polls probe until accept is true for its results, for up to converge.
// It returns the accepted results, or fails the test with the last ones.
func (e *env) eventually(t *testing.T, what string, probe func() []cluster.ProbeResult, accept func([]cluster.ProbeResult) bool) []cluster.ProbeResult {
	t.Helper()
	return poll(t, what, probe, accept, func() {
		if !e.proxy.Running() {
			t.Fatalf("%s: nftproxy exited; log:\n%s", what, e.proxy.Tail(40))
		}
	})
}

// poll repeats probe until accept is true for its results, for up to converge, calling
// alive (which fails the test if a proxy died) between attempts.
func poll(t *testing.T, what string, probe func() []cluster.ProbeResult, accept func([]cluster.ProbeResult) bool, alive func()) []cluster.ProbeResult {
	t.Helper()
	deadline := time.Now().Add(converge)
	for {
		res := probe()
		if accept(res) {
			return res
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v; last probes: %s", what, converge, summary(res))
		}
		alive()
		time.Sleep(200 * time.Millisecond)
	}
}

// waitOK waits until a connection from ns to addr is answered.
func (e *env) waitOK(t *testing.T, what, from, proto, addr string) {
	t.Helper()
	e.eventually(t, what, func() []cluster.ProbeResult { return e.probe(t, from, proto, addr, 1, 500*time.Millisecond) }, allOK)
}

// waitRefused waits until a connection from ns to addr is refused.
func (e *env) waitRefused(t *testing.T, what, from, proto, addr string) {
	t.Helper()
	e.eventually(t, what, func() []cluster.ProbeResult { return e.probe(t, from, proto, addr, 1, 500*time.Millisecond) }, allRefused)
}

func allOK(res []cluster.ProbeResult) bool {
	for _, r := range res {
		if !r.OK {
			return false
		}
	}
	return len(res) > 0
}

func allRefused(res []cluster.ProbeResult) bool {
	for _, r := range res {
		if r.OK || !r.Refused {
			return false
		}
	}
	return len(res) > 0
}

func noneOK(res []cluster.ProbeResult) bool {
	for _, r := range res {
		if r.OK {
			return false
		}
	}
	return true
}

func clientHost(r cluster.ProbeResult) string {
	h, _, err := net.SplitHostPort(r.Client)
	if err != nil {
		return r.Client
	}
	return h
}

// summary renders results compactly: answers per pod, client addresses seen, failures.
func summary(res []cluster.ProbeResult) string {
	pods, srcs, fails := map[string]int{}, map[string]int{}, map[string]int{}
	for _, r := range res {
		switch {
		case r.OK:
			pods[r.Pod]++
			srcs[clientHost(r)]++
		case r.Refused:
			fails[fmt.Sprintf("refused(%.0fms)", r.Millis)]++
		default:
			fails[r.Err]++
		}
	}
	return fmt.Sprintf("%d attempts: answered by %s, client seen as %s, failures %s",
		len(res), fmtCounts(pods), fmtCounts(srcs), fmtCounts(fails))
}

func fmtCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString("{")
	for i, k := range keys {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s:%d", k, m[k])
	}
	b.WriteString("}")
	return b.String()
}

// expectAnswered checks that every attempt was answered by one of pods and, when
// srcOK is not nil, that the server saw an acceptable client address.
func expectAnswered(t *testing.T, what string, res []cluster.ProbeResult, pods []*cluster.Pod, srcOK func(string) bool) {
	t.Helper()
	names := map[string]bool{}
	for _, p := range pods {
		names[p.Name] = true
	}
	bad := 0
	for _, r := range res {
		if !r.OK || !names[r.Pod] || (srcOK != nil && !srcOK(clientHost(r))) {
			bad++
		}
	}
	if bad > 0 {
		t.Errorf("%s: %d of %d attempts wrong: %s", what, bad, len(res), summary(res))
	} else {
		t.Logf("%s: %s", what, summary(res))
	}
}

// expectRejected checks that every attempt was refused, each well under a second.
func expectRejected(t *testing.T, what string, res []cluster.ProbeResult) {
	t.Helper()
	for _, r := range res {
		if r.OK || !r.Refused || r.Millis >= 500 {
			t.Errorf("%s: want every attempt refused in <500ms: %s", what, summary(res))
			return
		}
	}
	t.Logf("%s: %s", what, summary(res))
}

func is(ip string) func(string) bool { return func(s string) bool { return s == ip } }
func isNot(ips ...string) func(string) bool {
	return func(s string) bool { return s != "" && !slices.Contains(ips, s) }
}

func hostPort(ip string, port int32) string { return net.JoinHostPort(ip, fmt.Sprint(port)) }

// --- nft helpers ---------------------------------------------------------------------

func (e *env) nftList(ctx context.Context) (string, error) {
	out, err := e.c.Exec(ctx, e.c.NodeNS, "nft", "list", "table", "ip", tableName)
	return string(out), err
}

// commentRE matches an nft comment naming service ns/name (optionally with ":port").
func commentRE(name string) *regexp.Regexp {
	return regexp.MustCompile(`comment "` + regexp.QuoteMeta(ns+"/"+name) + `[":]`)
}

// --- subtests --------------------------------------------------------------------------

// a. ClusterIP from a pod (source kept), from the node and from off-cluster (masqueraded).
func (e *env) testClusterIPSources(t *testing.T) {
	c := e.c
	svc := e.createService(t, "basic", corev1.ServiceTypeClusterIP, nil, tcpPort("http", 8080, 8080))
	e.putSlice(t, svc, endpoint(e.web[0], ready), endpoint(e.web[1], ready))
	addr := hostPort(svc.Spec.ClusterIP, 8080)
	backends := e.web[:2]

	t.Run("from-pod", func(t *testing.T) {
		e.waitOK(t, "ClusterIP answers from a pod", e.client.NS, "tcp", addr)
		res := e.probe(t, e.client.NS, "tcp", addr, 20, time.Second)
		expectAnswered(t, "pod -> "+addr+" (source must be the client pod IP)", res, backends, is(e.client.IP.String()))
	})
	t.Run("from-node", func(t *testing.T) {
		e.waitOK(t, "ClusterIP answers from the node", c.NodeNS, "tcp", addr)
		res := e.probe(t, c.NodeNS, "tcp", addr, 20, time.Second)
		// The node's own address is outside --cluster-cidr: masqueraded, so the pod
		// sees the node's address on the pod link rather than the pre-NAT source.
		expectAnswered(t, "node -> "+addr+" (masqueraded)", res, backends, isNot(c.NodeIP.String()))
	})
	t.Run("from-external", func(t *testing.T) {
		e.waitOK(t, "ClusterIP answers from the external client", c.ExternalNS, "tcp", addr)
		res := e.probe(t, c.ExternalNS, "tcp", addr, 20, time.Second)
		expectAnswered(t, "external -> "+addr+" (masqueraded)", res, backends, isNot(c.ExternalIP.String()))
	})
}

// b. Service port 80 to targetPort 8080.
func (e *env) testTargetPort(t *testing.T) {
	svc := e.createService(t, "remap", corev1.ServiceTypeClusterIP, nil, tcpPort("http", 80, 8080))
	e.putSlice(t, svc, endpoint(e.web[0], ready), endpoint(e.web[1], ready))
	addr := hostPort(svc.Spec.ClusterIP, 80)
	e.waitOK(t, "port 80 answers", e.client.NS, "tcp", addr)
	res := e.probe(t, e.client.NS, "tcp", addr, 20, time.Second)
	expectAnswered(t, "pod -> "+addr, res, e.web[:2], is(e.client.IP.String()))
}

// c. One service with a TCP and a UDP port, slice ports matched by name.
func (e *env) testMultiPort(t *testing.T) {
	// Declare the UDP port first and the slice ports in the reverse order of the
	// service's, so matching by position would pick the wrong target port.
	svc := e.createService(t, "multi", corev1.ServiceTypeClusterIP, nil, udpPort("dns", 53, 9090), tcpPort("http", 80, 8080))
	sp := slicePorts(svc.Spec.Ports...)
	slices.Reverse(sp)
	eps := []discoveryv1.Endpoint{endpoint(e.web[0], ready), endpoint(e.web[2], ready)}
	_, err := e.c.Client.DiscoveryV1().EndpointSlices(ns).Create(t.Context(), &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:   "multi-e2e",
			Labels: map[string]string{discoveryv1.LabelServiceName: "multi", discoveryv1.LabelManagedBy: "e2e"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
		Ports:       sp,
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	backends := []*cluster.Pod{e.web[0], e.web[2]}
	tcp := hostPort(svc.Spec.ClusterIP, 80)
	udp := hostPort(svc.Spec.ClusterIP, 53)
	e.waitOK(t, "tcp port answers", e.client.NS, "tcp", tcp)
	e.waitOK(t, "udp port answers", e.client.NS, "udp", udp)
	expectAnswered(t, "tcp "+tcp, e.probe(t, e.client.NS, "tcp", tcp, 20, time.Second), backends, is(e.client.IP.String()))
	expectAnswered(t, "udp "+udp, e.probe(t, e.client.NS, "udp", udp, 20, time.Second), backends, is(e.client.IP.String()))
}

// d. NodePort on the node IP from the external client (masqueraded) and from a pod.
func (e *env) testNodePort(t *testing.T) {
	c := e.c
	svc := e.createService(t, "nodeport", corev1.ServiceTypeNodePort, nil, tcpPort("http", 80, 8080))
	e.putSlice(t, svc, endpoint(e.web[0], ready), endpoint(e.web[1], ready))
	np := svc.Spec.Ports[0].NodePort
	if np == 0 {
		t.Fatalf("no nodePort allocated: %s", portsString(svc))
	}
	addr := hostPort(c.NodeIP.String(), np)
	e.waitOK(t, "node port answers the external client", c.ExternalNS, "tcp", addr)
	res := e.probe(t, c.ExternalNS, "tcp", addr, 20, time.Second)
	expectAnswered(t, "external -> "+addr+" (masqueraded)", res, e.web[:2], isNot(c.ExternalIP.String()))
	expectAnswered(t, "pod -> "+addr, e.probe(t, e.client.NS, "tcp", addr, 10, time.Second), e.web[:2], nil)
	// The ClusterIP of a NodePort service works as well.
	expectAnswered(t, "pod -> ClusterIP", e.probe(t, e.client.NS, "tcp", hostPort(svc.Spec.ClusterIP, 80), 10, time.Second),
		e.web[:2], is(e.client.IP.String()))
}

// e. spec.externalIPs captured for the external client.
func (e *env) testExternalIP(t *testing.T) {
	c := e.c
	svc := e.createService(t, "extip", corev1.ServiceTypeClusterIP, []string{externalIP}, tcpPort("http", 80, 8080))
	e.putSlice(t, svc, endpoint(e.web[1], ready), endpoint(e.web[2], ready))
	addr := hostPort(externalIP, 80)
	e.waitOK(t, "external IP answers", c.ExternalNS, "tcp", addr)
	res := e.probe(t, c.ExternalNS, "tcp", addr, 20, time.Second)
	expectAnswered(t, "external -> "+addr+" (masqueraded)", res, e.web[1:3], isNot(c.ExternalIP.String()))
}

// f. A LoadBalancer service's status.loadBalancer.ingress IP captured.
func (e *env) testLoadBalancer(t *testing.T) {
	c := e.c
	svc := e.createService(t, "lb", corev1.ServiceTypeLoadBalancer, nil, tcpPort("http", 80, 8080))
	e.putSlice(t, svc, endpoint(e.web[0], ready), endpoint(e.web[2], ready))
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: lbIP}}
	if _, err := c.Client.CoreV1().Services(ns).UpdateStatus(t.Context(), svc, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update status: %v", err)
	}
	addr := hostPort(lbIP, 80)
	backends := []*cluster.Pod{e.web[0], e.web[2]}
	e.waitOK(t, "LB ingress IP answers", c.ExternalNS, "tcp", addr)
	res := e.probe(t, c.ExternalNS, "tcp", addr, 20, time.Second)
	expectAnswered(t, "external -> "+addr+" (masqueraded)", res, backends, isNot(c.ExternalIP.String()))
}

// g. No endpoints: rejected at once (TCP and UDP, ClusterIP and NodePort).
func (e *env) testNoEndpoints(t *testing.T) {
	c := e.c
	svc := e.createService(t, "noeps", corev1.ServiceTypeNodePort, nil, tcpPort("http", 80, 8080), udpPort("dns", 53, 9090))
	tcp := hostPort(svc.Spec.ClusterIP, 80)
	udp := hostPort(svc.Spec.ClusterIP, 53)
	e.waitRefused(t, "ClusterIP without endpoints rejected", e.client.NS, "tcp", tcp)
	expectRejected(t, "pod -> tcp "+tcp, e.probe(t, e.client.NS, "tcp", tcp, 10, 2*time.Second))
	res, err := c.Probe(t.Context(), e.client.NS, cluster.ProbeSpec{Proto: "udp", Addr: udp, Count: 3, Timeout: 2 * time.Second, Interval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	expectRejected(t, "pod -> udp "+udp, res)
	expectRejected(t, "external -> tcp "+tcp, e.probe(t, c.ExternalNS, "tcp", tcp, 5, 2*time.Second))

	npTCP := hostPort(c.NodeIP.String(), svc.Spec.Ports[0].NodePort)
	npUDP := hostPort(c.NodeIP.String(), svc.Spec.Ports[1].NodePort)
	expectRejected(t, "external -> node port tcp "+npTCP, e.probe(t, c.ExternalNS, "tcp", npTCP, 5, 2*time.Second))
	res, err = c.Probe(t.Context(), c.ExternalNS, cluster.ProbeSpec{Proto: "udp", Addr: npUDP, Count: 2, Timeout: 2 * time.Second, Interval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	expectRejected(t, "external -> node port udp "+npUDP, res)

	// The apiserver's own "kubernetes" service has no endpoints in this cluster
	// (--endpoint-reconciler-type=none).
	k, err := c.Client.CoreV1().Services(ns).Get(t.Context(), "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	expectRejected(t, "pod -> kubernetes "+k.Spec.ClusterIP+":443",
		e.probe(t, e.client.NS, "tcp", hostPort(k.Spec.ClusterIP, 443), 3, 2*time.Second))
}

// h. Endpoints appear later, scale 2 -> 3 (uniform spread), then back to 0.
func (e *env) testEndpointsChange(t *testing.T) {
	svc := e.createService(t, "scale", corev1.ServiceTypeClusterIP, nil, tcpPort("http", 80, 8080))
	e.putSlice(t, svc) // empty slice
	addr := hostPort(svc.Spec.ClusterIP, 80)
	from := e.client.NS

	e.waitRefused(t, "empty service rejected", from, "tcp", addr)
	expectRejected(t, "0 endpoints", e.probe(t, from, "tcp", addr, 5, 2*time.Second))

	e.putSlice(t, svc, endpoint(e.web[0], ready), endpoint(e.web[1], ready))
	e.waitOK(t, "first endpoints used", from, "tcp", addr)
	res := e.probe(t, from, "tcp", addr, 30, time.Second)
	expectAnswered(t, "2 endpoints", res, e.web[:2], is(e.client.IP.String()))

	e.putSlice(t, svc, endpoint(e.web[0], ready), endpoint(e.web[1], ready), endpoint(e.web[2], ready))
	e.eventually(t, "third endpoint used", func() []cluster.ProbeResult {
		return e.probe(t, from, "tcp", addr, 10, 500*time.Millisecond)
	}, func(res []cluster.ProbeResult) bool {
		return allOK(res) && slices.ContainsFunc(res, func(r cluster.ProbeResult) bool { return r.Pod == e.web[2].Name })
	})
	const n, min = 150, 25 // expected 50 each; below 25 is > 4 standard deviations off
	res = e.probe(t, from, "tcp", addr, n, time.Second)
	expectAnswered(t, "3 endpoints", res, e.web, is(e.client.IP.String()))
	count := map[string]int{}
	for _, r := range res {
		if r.OK {
			count[r.Pod]++
		}
	}
	for _, p := range e.web {
		if count[p.Name] < min {
			t.Errorf("uneven spread over %d connections: %s got %d (want >= %d): %s", n, p.Name, count[p.Name], min, fmtCounts(count))
		}
	}

	e.putSlice(t, svc)
	e.waitRefused(t, "rejected again after scaling to 0", from, "tcp", addr)
	expectRejected(t, "back to 0 endpoints", e.probe(t, from, "tcp", addr, 5, 2*time.Second))
}

// i. ready=false endpoints are never used while a ready one exists; with none ready,
// serving+terminating endpoints are the fallback (never serving=false ones).
func (e *env) testNotReady(t *testing.T) {
	svc := e.createService(t, "notready", corev1.ServiceTypeClusterIP, nil, tcpPort("http", 80, 8080))
	e.putSlice(t, svc, endpoint(e.web[0], ready), endpoint(e.web[1], notReady), endpoint(e.web[2], terminating))
	addr := hostPort(svc.Spec.ClusterIP, 80)
	e.waitOK(t, "service answers", e.client.NS, "tcp", addr)
	expectAnswered(t, "1 ready + 1 not ready + 1 terminating", e.probe(t, e.client.NS, "tcp", addr, 60, time.Second), e.web[:1], nil)

	e.putSlice(t, svc, endpoint(e.web[1], notReady), endpoint(e.web[2], terminating))
	e.eventually(t, "terminating fallback used", func() []cluster.ProbeResult {
		return e.probe(t, e.client.NS, "tcp", addr, 3, 500*time.Millisecond)
	}, func(res []cluster.ProbeResult) bool {
		return allOK(res) && !slices.ContainsFunc(res, func(r cluster.ProbeResult) bool { return r.Pod == e.web[0].Name })
	})
	expectAnswered(t, "0 ready: only the serving+terminating one", e.probe(t, e.client.NS, "tcp", addr, 30, time.Second), e.web[2:3], nil)
}

// j. A pod reaching itself through its service is masqueraded.
func (e *env) testHairpin(t *testing.T) {
	self := e.web[0]
	svc := e.createService(t, "hairpin", corev1.ServiceTypeClusterIP, nil, tcpPort("http", 80, 8080))
	e.putSlice(t, svc, endpoint(self, ready))
	addr := hostPort(svc.Spec.ClusterIP, 80)
	e.waitOK(t, "hairpin answers", self.NS, "tcp", addr)
	res := e.probe(t, self.NS, "tcp", addr, 10, time.Second)
	expectAnswered(t, self.Name+" -> "+addr+" -> itself (masqueraded)", res, []*cluster.Pod{self}, isNot(self.IP.String()))
	// Another pod to the same service keeps its source.
	expectAnswered(t, "client -> "+addr, e.probe(t, e.client.NS, "tcp", addr, 5, time.Second), []*cluster.Pod{self}, is(e.client.IP.String()))
}

// k. A port the ClusterIP service does not define is rejected.
func (e *env) testUndefinedPort(t *testing.T) {
	svc := e.createService(t, "oneport", corev1.ServiceTypeClusterIP, nil, tcpPort("http", 80, 8080))
	e.putSlice(t, svc, endpoint(e.web[0], ready))
	e.waitOK(t, "defined port answers", e.client.NS, "tcp", hostPort(svc.Spec.ClusterIP, 80))
	tcp := hostPort(svc.Spec.ClusterIP, 81)
	expectRejected(t, "pod -> tcp "+tcp, e.probe(t, e.client.NS, "tcp", tcp, 5, 2*time.Second))
	expectRejected(t, "external -> tcp "+tcp, e.probe(t, e.c.ExternalNS, "tcp", tcp, 3, 2*time.Second))
	// 8080 is the target port: reachable on the pod, not on the ClusterIP.
	expectRejected(t, "pod -> tcp target port on ClusterIP", e.probe(t, e.client.NS, "tcp", hostPort(svc.Spec.ClusterIP, 8080), 3, 2*time.Second))
	udp := hostPort(svc.Spec.ClusterIP, 80) // the service has TCP 80 only
	res, err := e.c.Probe(t.Context(), e.client.NS, cluster.ProbeSpec{Proto: "udp", Addr: udp, Count: 2, Timeout: 2 * time.Second, Interval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	expectRejected(t, "pod -> udp "+udp, res)
}

// m. The table lists cleanly and names every service in comments.
func (e *env) testNftList(t *testing.T) {
	var out string
	deadline := time.Now().Add(converge)
	for {
		var err error
		out, err = e.nftList(t.Context())
		if err != nil {
			t.Fatalf("nft list table ip %s: %v\n%s", tableName, err, out)
		}
		missing := 0
		for _, name := range e.svcs {
			if !commentRE(name).MatchString(out) {
				missing++
			}
		}
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			for _, name := range e.svcs {
				if !commentRE(name).MatchString(out) {
					t.Errorf("no comment naming %s/%s", ns, name)
				}
			}
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, bad := range []string{"error", "unknown"} {
		if strings.Contains(strings.ToLower(out), bad) {
			t.Errorf("nft list output contains %q:\n%s", bad, out)
		}
	}
	t.Logf("nft list table ip %s: %d lines, comments for %d services", tableName, strings.Count(out, "\n"), len(e.svcs))
}

// --dry-run prints the ruleset in nft syntax and exits 0.
func (e *env) testDryRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c := e.c
	out, err := c.Exec(ctx, c.NodeNS, e.bin, "--dry-run", "--kubeconfig", c.LeastPrivilegeKubeconfigT(t),
		"--hostname-override", c.NodeName, "--cluster-cidr", clusterCIDR)
	if err != nil {
		t.Fatalf("nftproxy --dry-run: %v\n%s", err, out)
	}
	if !regexp.MustCompile(`table ip ` + tableName + `\b`).Match(out) {
		t.Errorf("--dry-run output has no 'table ip %s':\n%s", tableName, out)
	}
	for _, name := range e.svcs {
		if !strings.Contains(string(out), ns+"/"+name) {
			t.Errorf("--dry-run output does not mention %s/%s", ns, name)
		}
	}
}

// l. A deleted service stops answering and leaves no trace in the table.
func (e *env) testServiceDeleted(t *testing.T) {
	svc := e.createService(t, "deleted-svc", corev1.ServiceTypeClusterIP, nil, tcpPort("http", 80, 8080))
	e.putSlice(t, svc, endpoint(e.web[1], ready))
	addr := hostPort(svc.Spec.ClusterIP, 80)
	e.waitOK(t, "service answers before deletion", e.client.NS, "tcp", addr)
	if out, err := e.nftList(t.Context()); err != nil || !strings.Contains(out, ns+"/deleted-svc") {
		t.Fatalf("before deletion the table does not mention %s/deleted-svc (err %v):\n%s", ns, err, out)
	}

	if err := e.c.Client.CoreV1().Services(ns).Delete(t.Context(), svc.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.svcs = slices.DeleteFunc(e.svcs, func(s string) bool { return s == svc.Name })
	// The slice stays (there is no garbage collector): an orphan slice must not
	// resurrect anything.
	e.eventually(t, "deleted service stops answering", func() []cluster.ProbeResult {
		return e.probe(t, e.client.NS, "tcp", addr, 1, 500*time.Millisecond)
	}, noneOK)
	res := e.probe(t, e.client.NS, "tcp", addr, 5, 500*time.Millisecond)
	if !noneOK(res) {
		t.Errorf("deleted service still answers: %s", summary(res))
	} else {
		t.Logf("after deletion: %s", summary(res))
	}

	ipRE := regexp.MustCompile(`(^|[^0-9.])` + regexp.QuoteMeta(svc.Spec.ClusterIP) + `([^0-9]|$)`)
	var out string
	deadline := time.Now().Add(converge)
	for {
		var err error
		if out, err = e.nftList(t.Context()); err != nil {
			t.Fatalf("nft list: %v\n%s", err, out)
		}
		if !strings.Contains(out, ns+"/deleted-svc") && !ipRE.MatchString(out) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("table still mentions %s/deleted-svc or %s %v after deletion:\n%s", ns, svc.Spec.ClusterIP, converge, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := e.c.Client.DiscoveryV1().EndpointSlices(ns).Delete(t.Context(), svc.Name+"-e2e", metav1.DeleteOptions{}); err != nil {
		t.Errorf("delete orphan slice: %v", err)
	}
}

// n. SIGTERM leaves the rules in place (traffic keeps flowing); --cleanup removes them.
func (e *env) testCleanup(t *testing.T) {
	c := e.c
	ctx := t.Context()
	svc, err := c.Client.CoreV1().Services(ns).Get(ctx, "remap", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	addr := hostPort(svc.Spec.ClusterIP, 80)
	if !e.proxy.Running() {
		t.Fatalf("nftproxy is not running; log:\n%s", e.proxy.Tail(40))
	}

	start := time.Now()
	e.proxy.Stop() // SIGTERM, SIGKILL after 3s
	st := e.proxy.Cmd.ProcessState
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
		t.Errorf("nftproxy did not exit within 3s of SIGTERM (killed); log:\n%s", e.proxy.Tail(20))
	} else {
		t.Logf("nftproxy stopped after %v: %v", time.Since(start).Round(time.Millisecond), st)
	}

	if out, err := e.nftList(ctx); err != nil || !strings.Contains(out, ns+"/remap") {
		t.Errorf("after SIGTERM the table should stay: err %v\n%s", err, out)
	}
	expectAnswered(t, "service after SIGTERM (rules stay)", e.probe(t, e.client.NS, "tcp", addr, 5, time.Second), e.web[:2], nil)

	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := c.Exec(cctx, c.NodeNS, e.bin, "--cleanup")
	if err != nil {
		t.Fatalf("nftproxy --cleanup: %v\n%s", err, out)
	}
	rs, err := c.Exec(ctx, c.NodeNS, "nft", "list", "ruleset")
	if err != nil {
		t.Fatalf("nft list ruleset: %v\n%s", err, rs)
	}
	if strings.Contains(string(rs), tableName) {
		t.Errorf("nft list ruleset after --cleanup still mentions %s:\n%s", tableName, rs)
	}
	if res := e.probe(t, e.client.NS, "tcp", addr, 2, time.Second); !noneOK(res) {
		t.Errorf("service still answers after --cleanup: %s", summary(res))
	}
	// A second cleanup with nothing to remove succeeds too.
	if out, err := c.Exec(cctx, c.NodeNS, e.bin, "--cleanup"); err != nil {
		t.Errorf("second nftproxy --cleanup: %v\n%s", err, out)
	}
}
