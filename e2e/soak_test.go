package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/nftproxy/nftproxy/e2e/cluster"
)

// Churn soak (docs/reliability.md): random creates, updates and deletes of Services and
// EndpointSlices at about 50 changes/s for SOAK_DURATION (default 4m; `make soak` runs
// longer) while a client connects to a stable service the whole time. Then: no failed
// connection to it, `nftproxy verify` finds the kernel equal to what the API compiles
// to, and, with the same API state before and after, the proxy's live heap (after a
// forced collection) grew by at most soakHeapSlack bytes and its RSS by at most 25% (RSS
// also moves with the runtime's returning of memory to the system, which a loaded
// machine delays). The heap's slack is absolute: bounded caches fill up during the churn
// (client-go's event correlator keeps up to 4,096 entries per LRU, one per distinct
// Warning event) and Go maps keep the buckets of their largest size (measured in CI:
// +1.0 to +1.4 MiB on a 5.5 MiB heap after 12,000 changes, with no function growing in
// the heap profiles); a leak grows with the number of changes, and `make soak` (30 min,
// ~90,000 changes) puts it far past the slack. Each run logs the growth per change.
const (
	soakRate          = 50 // changes per second
	soakMaxServices   = 80 // churned services alive at once
	soakWarmup        = 20 * time.Second
	soakProbeInterval = 20 * time.Millisecond
	soakHeapSlack     = 3 << 20 // bytes
	soakRSSTolerance  = 0.25
	soakPrefix        = "churn-"
)

func soakDuration(t *testing.T) time.Duration {
	s := os.Getenv("SOAK_DURATION")
	if s == "" {
		return 4 * time.Minute
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		t.Fatalf("SOAK_DURATION=%q is not a positive duration", s)
	}
	return d
}

func TestChurnSoak(t *testing.T) {
	cluster.Require(t)
	duration := soakDuration(t)
	e := newEnv(t, 2)
	ctx, c := t.Context(), e.c
	kubeconfig := c.LeastPrivilegeKubeconfigT(t)
	// --profiling: /debug/pprof/heap?gc=1 forces a collection before each memory reading.
	e.startProxy(t, kubeconfig, "--min-sync-period", "100ms", "--metrics-bind-address", "127.0.0.1:10249", "--profiling")
	verifyArgs := []string{e.bin, "verify", "--kubeconfig", kubeconfig, "--hostname-override", c.NodeName, "--cluster-cidr", clusterCIDR}

	stable := e.createService(t, "stable", corev1.ServiceTypeClusterIP, nil, tcpPort("http", 80, 8080))
	e.putSlice(t, stable, endpoint(e.web[0], ready), endpoint(e.web[1], ready))
	addr := hostPort(stable.Spec.ClusterIP, 80)
	e.waitOK(t, "stable service", e.client.NS, "tcp", addr)

	total := soakWarmup + duration + 2*time.Minute
	run, err := c.StartProbe(ctx, e.client.NS, cluster.ProbeSpec{
		Proto: "tcp", Addr: addr, Count: int(total / soakProbeInterval), Timeout: time.Second, Interval: soakProbeInterval,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer run.Stop()

	// Warm-up: the same churn for a while, then everything churned is deleted, so that
	// "before" and "after" are measured with the same API state and a warmed-up process.
	ch := &churner{client: c.Client, rng: rand.New(rand.NewPCG(1, uint64(time.Now().UnixNano()))), svcs: map[string]*corev1.Service{}, slices: map[string]*discoveryv1.EndpointSlice{}}
	ch.run(ctx, soakWarmup)
	ch.deleteAll(ctx)
	e.verifyEventually(t, verifyArgs, "after the warm-up")
	before := e.settledMemory(t)
	beforeProfile := e.heapProfile(t, "before")
	t.Logf("before the churn: %s", before)

	start := time.Now()
	warmupChanges := ch.changes
	ch.changes, ch.byKind, ch.failures = 0, map[string]int{}, 0
	ch.run(ctx, duration)
	churned := time.Since(start)
	alive := len(ch.svcs)
	// The final state, with whatever the churn left alive.
	verifyOut := e.verifyEventually(t, verifyArgs, "after the churn")

	ch.deleteAll(ctx)
	e.verifyEventually(t, verifyArgs, "after deleting the churned objects")
	after := e.settledMemory(t)
	e.logHeapGrowth(t, beforeProfile, e.heapProfile(t, "after"))
	res, err := run.Stop()
	if err != nil {
		t.Error(err)
	}

	// connections
	var failed []cluster.ProbeResult
	pods := map[string]int{}
	for _, r := range res {
		if !r.OK {
			failed = append(failed, r)
		}
		pods[r.Pod]++
	}
	probeSpan := time.Duration(0)
	if len(res) > 1 {
		probeSpan = res[len(res)-1].At.Sub(res[0].At)
	}
	connRate := float64(len(res)) / probeSpan.Seconds()
	t.Logf("SOAK: %s of churn: %d changes (%.1f/s; %s), %d failed API calls, %d warm-up changes, %d churned services alive at the end",
		churned.Round(time.Second), ch.changes, float64(ch.changes)/churned.Seconds(), fmtCounts(ch.byKind), ch.failures, warmupChanges, alive)
	t.Logf("SOAK: %d connections to the stable service over %s (%.1f/s), %d failed, answered by %s",
		len(res), probeSpan.Round(time.Second), connRate, len(failed), fmtCounts(pods))
	t.Logf("SOAK: nftproxy verify after the churn: %s", strings.TrimSpace(verifyOut))
	t.Logf("SOAK: memory before %s; after %s; RSS %+.1f%%", before, after, 100*(float64(after.rss)/float64(before.rss)-1))

	if len(failed) != 0 {
		for _, r := range failed[:min(len(failed), 10)] {
			t.Errorf("failed connection at %s: %s", r.At.Format(time.RFC3339Nano), r.Err)
		}
		t.Errorf("%d of %d connections to the stable service failed, want 0", len(failed), len(res))
	}
	if connRate < 20 {
		t.Errorf("client made %.1f connections/s, want at least 20", connRate)
	}
	if got := float64(ch.changes) / churned.Seconds(); got < 0.6*soakRate {
		t.Errorf("churn reached %.1f changes/s, want about %d", got, soakRate)
	}
	if ch.failures > ch.changes/100 {
		t.Errorf("%d API calls of the churner failed (of %d changes)", ch.failures, ch.changes)
	}
	t.Logf("SOAK: live heap %+d bytes over %d changes (%.0f bytes per change)", after.heap-before.heap, ch.changes, float64(after.heap-before.heap)/float64(ch.changes))
	if after.heap-before.heap > soakHeapSlack {
		t.Errorf("live heap grew from %d to %d bytes, more than %d", before.heap, after.heap, soakHeapSlack)
	}
	if float64(after.rss) > float64(before.rss)*(1+soakRSSTolerance) {
		t.Errorf("RSS grew from %d to %d KiB, more than %.0f%%", before.rss, after.rss, 100*soakRSSTolerance)
	}
	if !e.proxy.Running() {
		t.Errorf("nftproxy exited; log:\n%s", e.proxy.Tail(40))
	}
}

// verifyEventually runs `nftproxy verify --wait` in the node namespace: it compares until
// the proxy has caught up with the API (bounded), and must then exit 0.
func (e *env) verifyEventually(t *testing.T, args []string, when string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	out, err := e.c.Exec(ctx, e.c.NodeNS, append(args, "--wait", "60s")...)
	if err != nil {
		var exit *exec.ExitError
		code := -1
		if errors.As(err, &exit) {
			code = exit.ExitCode()
		}
		t.Fatalf("nftproxy verify %s: exit code %d (%v), want 0:\n%s\nproxy log:\n%s", when, code, err, out, e.proxy.Tail(20))
	}
	t.Logf("nftproxy verify %s: %s", when, strings.TrimSpace(string(out)))
	return string(out)
}

// memory is one reading of the proxy's memory.
type memory struct {
	rss  int64 // KiB, /proc/<pid>/status VmRSS
	heap int64 // bytes, go_memstats_heap_inuse_bytes
}

func (m memory) String() string {
	return fmt.Sprintf("RSS %.1f MiB, Go heap in use %.1f MiB", float64(m.rss)/1024, float64(m.heap)/(1<<20))
}

// settledMemory waits for the proxy to be idle (no pending change in its metrics) and
// returns the lowest of ten readings a second apart, each after a forced garbage
// collection (the heap profile with gc=1): the reading after the collector and the
// scavenger have caught up.
func (e *env) settledMemory(t *testing.T) memory {
	t.Helper()
	best := memory{rss: 1 << 62}
	for range 10 {
		time.Sleep(time.Second)
		m := e.metrics(t)
		if m["kubeproxy_sync_proxy_rules_endpoint_changes_pending"]+m["kubeproxy_sync_proxy_rules_service_changes_pending"] != 0 {
			continue
		}
		e.forceGC(t)
		m = e.metrics(t)
		rss := vmRSS(t, e.proxy.PID())
		if rss < best.rss {
			best = memory{rss: rss, heap: int64(m["go_memstats_heap_inuse_bytes"])}
		}
	}
	if best.rss == 1<<62 {
		t.Fatal("nftproxy had pending changes for 10s after the churn stopped")
	}
	return best
}

func vmRSS(t *testing.T, pid int) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}

// metrics returns the proxy's unlabelled metric samples.
// forceGC makes the proxy collect garbage: its heap profile with gc=1 runs a collection
// first (served with --profiling). Twice: objects kept in a sync.Pool (the metrics
// handler's gzip writers, ~0.9 MiB, which were all of the "growth" a first soak saw)
// survive one collection and go with the second.
func (e *env) forceGC(t *testing.T) {
	t.Helper()
	for range 2 {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		code, _, err := e.c.HTTPGet(ctx, e.c.NodeNS, "http://127.0.0.1:10249/debug/pprof/heap?gc=1")
		cancel()
		if err != nil || code != 200 {
			t.Fatalf("heap profile: %d %v", code, err)
		}
	}
}

// heapProfile saves the proxy's heap profile (after a collection) in the cluster's work
// directory and returns its path.
func (e *env) heapProfile(t *testing.T, name string) string {
	t.Helper()
	e.forceGC(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	code, body, err := e.c.HTTPGet(ctx, e.c.NodeNS, "http://127.0.0.1:10249/debug/pprof/heap?gc=1")
	if err != nil || code != 200 {
		t.Fatalf("heap profile: %d %v", code, err)
	}
	path := filepath.Join(e.c.WorkDir, "heap-"+name+".pb.gz")
	if err := os.WriteFile(path, body, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// logHeapGrowth logs where the live heap grew between two profiles (go tool pprof's
// top of the difference), so that a failed leak check says what grew.
func (e *env) logHeapGrowth(t *testing.T, before, after string) {
	out, err := exec.Command("go", "tool", "pprof", "-top", "-sample_index=inuse_space", "-nodecount=15", "-diff_base", before, e.bin, after).CombinedOutput()
	if err != nil {
		t.Logf("go tool pprof: %v\n%s", err, out)
		return
	}
	t.Logf("SOAK: live heap growth by function (profiles %s, %s):\n%s", before, after, out)
}

func (e *env) metrics(t *testing.T) map[string]float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	code, body, err := e.c.HTTPGet(ctx, e.c.NodeNS, "http://127.0.0.1:10249/metrics")
	if err != nil || code != 200 {
		t.Fatalf("metrics: %d %v", code, err)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		name, val, ok := strings.Cut(line, " ")
		if !ok || strings.HasPrefix(line, "#") || strings.Contains(name, "{") {
			continue
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err == nil {
			out[name] = v
		}
	}
	return out
}

// churner makes random changes to selector-less services and their EndpointSlices in
// the default namespace, never touching the stable service.
type churner struct {
	client   kubernetes.Interface
	rng      *rand.Rand
	svcs     map[string]*corev1.Service // alive, by name
	slices   map[string]*discoveryv1.EndpointSlice
	next     int
	changes  int
	failures int
	byKind   map[string]int
}

// run makes soakRate changes a second until d has passed or ctx ends.
func (ch *churner) run(ctx context.Context, d time.Duration) {
	if ch.byKind == nil {
		ch.byKind = map[string]int{}
	}
	start := time.Now()
	for n := 0; time.Since(start) < d && ctx.Err() == nil; n++ {
		// change n is due at start + n/rate; a slow API call is caught up on
		if wait := time.Until(start.Add(time.Duration(n) * time.Second / soakRate)); wait > 0 {
			time.Sleep(wait)
		}
		kind, err := ch.step(ctx)
		if err != nil {
			ch.failures++
			continue
		}
		ch.changes++
		ch.byKind[kind]++
	}
}

func (ch *churner) pick() *corev1.Service {
	if len(ch.svcs) == 0 {
		return nil
	}
	i := ch.rng.IntN(len(ch.svcs))
	for _, s := range ch.svcs {
		if i == 0 {
			return s
		}
		i--
	}
	return nil
}

// step makes one random change and names its kind.
func (ch *churner) step(ctx context.Context) (string, error) {
	svcs := ch.client.CoreV1().Services(ns)
	slices := ch.client.DiscoveryV1().EndpointSlices(ns)
	s := ch.pick()
	r := ch.rng.IntN(100)
	switch {
	case s == nil || (r < 15 && len(ch.svcs) < soakMaxServices):
		ch.next++
		svc, err := svcs.Create(ctx, ch.randomService(fmt.Sprintf("%s%d", soakPrefix, ch.next)), metav1.CreateOptions{})
		if err != nil {
			return "", err
		}
		ch.svcs[svc.Name] = svc
		if svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
			svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: fmt.Sprintf("198.51.100.%d", 1+ch.rng.IntN(250))}}
			if svc, err = svcs.UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
				return "", err
			}
			ch.svcs[svc.Name] = svc
		}
		return "service create", nil
	case r < 30:
		if err := svcs.Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil {
			return "", err
		}
		delete(ch.svcs, s.Name)
		for _, suffix := range []string{"-a", "-b"} { // an orphan slice is harmless, but tidy up
			if ch.slices[s.Name+suffix] != nil {
				_ = slices.Delete(ctx, s.Name+suffix, metav1.DeleteOptions{})
				delete(ch.slices, s.Name+suffix)
			}
		}
		return "service delete", nil
	case r < 45:
		upd := s.DeepCopy()
		ch.mutateService(upd)
		svc, err := svcs.Update(ctx, upd, metav1.UpdateOptions{})
		if err != nil {
			return "", err
		}
		ch.svcs[svc.Name] = svc
		return "service update", nil
	case r < 90:
		slice := ch.randomSlice(s, []string{"-a", "-b"}[ch.rng.IntN(2)])
		if old := ch.slices[slice.Name]; old != nil { // the churner is the only writer
			slice.ResourceVersion = old.ResourceVersion
			out, err := slices.Update(ctx, slice, metav1.UpdateOptions{})
			if err == nil {
				ch.slices[slice.Name] = out
			}
			return "slice update", err
		}
		out, err := slices.Create(ctx, slice, metav1.CreateOptions{})
		if err == nil {
			ch.slices[slice.Name] = out
		}
		return "slice create", err
	default:
		slice := ch.randomSlice(s, []string{"-a", "-b"}[ch.rng.IntN(2)])
		if ch.slices[slice.Name] == nil { // nothing to delete: create it instead
			out, err := slices.Create(ctx, slice, metav1.CreateOptions{})
			if err == nil {
				ch.slices[slice.Name] = out
			}
			return "slice create", err
		}
		err := slices.Delete(ctx, slice.Name, metav1.DeleteOptions{})
		if err == nil || apierrors.IsNotFound(err) {
			delete(ch.slices, slice.Name)
		}
		return "slice delete", err
	}
}

func (ch *churner) randomService(name string) *corev1.Service {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name}}
	types := []corev1.ServiceType{corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer}
	svc.Spec.Type = types[ch.rng.IntN(len(types))]
	n := 1 + ch.rng.IntN(2)
	for i := range n {
		p := tcpPort(fmt.Sprintf("p%d", i), int32(80+i), int32(8080+i))
		if ch.rng.IntN(3) == 0 {
			p.Protocol = corev1.ProtocolUDP
		}
		svc.Spec.Ports = append(svc.Spec.Ports, p)
	}
	ch.mutateService(svc)
	return svc
}

// mutateService changes external IPs, traffic policies, affinity or a port.
func (ch *churner) mutateService(svc *corev1.Service) {
	kind := ch.rng.IntN(5)
	if kind == 1 && svc.Spec.Type == corev1.ServiceTypeClusterIP {
		kind = 4 // no external traffic policy: change a port instead
	}
	switch kind {
	case 0:
		svc.Spec.ExternalIPs = nil
		if ch.rng.IntN(2) == 0 {
			svc.Spec.ExternalIPs = []string{fmt.Sprintf("203.0.113.%d", 1+ch.rng.IntN(250))}
		}
	case 1:
		svc.Spec.ExternalTrafficPolicy = []corev1.ServiceExternalTrafficPolicy{corev1.ServiceExternalTrafficPolicyCluster, corev1.ServiceExternalTrafficPolicyLocal}[ch.rng.IntN(2)]
		if svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyCluster {
			svc.Spec.HealthCheckNodePort = 0
		}
	case 2:
		if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
			svc.Spec.SessionAffinity, svc.Spec.SessionAffinityConfig = corev1.ServiceAffinityNone, nil
		} else {
			svc.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		}
	case 3:
		svc.Spec.InternalTrafficPolicy = ptr.To([]corev1.ServiceInternalTrafficPolicy{corev1.ServiceInternalTrafficPolicyCluster, corev1.ServiceInternalTrafficPolicyLocal}[ch.rng.IntN(2)])
	default:
		p := &svc.Spec.Ports[ch.rng.IntN(len(svc.Spec.Ports))]
		p.TargetPort = intstr.FromInt32(8000 + int32(ch.rng.IntN(100)))
	}
}

// randomSlice is a slice of 0-6 random endpoints with random conditions, on this node
// or another, for the service's ports.
func (ch *churner) randomSlice(svc *corev1.Service, suffix string) *discoveryv1.EndpointSlice {
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:   svc.Name + suffix,
			Labels: map[string]string{discoveryv1.LabelServiceName: svc.Name, discoveryv1.LabelManagedBy: "e2e-soak"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{},
		Ports:       slicePorts(svc.Spec.Ports...),
	}
	for range ch.rng.IntN(7) {
		r, s, term := ch.rng.IntN(4) != 0, ch.rng.IntN(2) == 0, ch.rng.IntN(4) == 0
		if r {
			s, term = true, false
		}
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{fmt.Sprintf("10.244.%d.%d", 2+ch.rng.IntN(3), 2+ch.rng.IntN(250))},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(r), Serving: ptr.To(s), Terminating: ptr.To(term)},
			NodeName:   ptr.To([]string{"node-1", "node-2"}[ch.rng.IntN(2)]),
		})
	}
	return slice
}

// deleteAll deletes every churned service and slice.
func (ch *churner) deleteAll(ctx context.Context) {
	for name := range ch.svcs {
		_ = ch.client.CoreV1().Services(ns).Delete(ctx, name, metav1.DeleteOptions{})
		delete(ch.svcs, name)
	}
	clear(ch.slices)
	list, err := ch.client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelManagedBy + "=e2e-soak"})
	if err == nil {
		for _, s := range list.Items {
			_ = ch.client.DiscoveryV1().EndpointSlices(ns).Delete(ctx, s.Name, metav1.DeleteOptions{})
		}
	}
}
