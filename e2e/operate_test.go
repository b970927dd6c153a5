package e2e

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nftproxy/nftproxy/e2e/cluster"
)

// Operating the running proxy: metrics after a known amount of traffic, and explain
// against the live API.

// testMetrics sends a known number of connections to a new service and reads the
// running nftproxy's metrics: the kernel's per-service packet counter on
// /metrics/services, and kube-proxy's sync metrics on /metrics, which has no
// per-service series.
func (e *env) testMetrics(t *testing.T) {
	svc := e.createService(t, "counted", corev1.ServiceTypeClusterIP, nil, tcpPort("http", 80, 8080))
	e.putSlice(t, svc, endpoint(e.web[0], ready))
	addr := hostPort(svc.Spec.ClusterIP, 80)
	e.waitOK(t, "counted answers", e.client.NS, "tcp", addr)
	before := e.servicePackets(t, "counted")
	const conns = 10
	res := e.probe(t, e.client.NS, "tcp", addr, conns, time.Second)
	expectAnswered(t, "pod -> "+addr, res, e.web[:1], is(e.client.IP.String()))
	// Each TCP connection sends at least its SYN, the handshake's ACK and a FIN to the
	// service address. One kernel read of the counters serves scrapes for 20 times its
	// own cost (internal/metrics), so a scrape right after the traffic may still show
	// the last read: poll, within a bound far above that window.
	var got float64
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if got = e.servicePackets(t, "counted") - before; got >= 3*conns || time.Now().After(deadline) {
			break
		}
	}
	if got < 3*conns {
		t.Errorf("nftproxy_service_packets_total for default/counted grew by %v within 10 s of %d connections, want >= %d", got, conns, 3*conns)
	}
	m := e.scrape(t)
	if strings.Contains(m, "nftproxy_service_packets_total") || strings.Contains(m, "nftproxy_service_bytes_total") {
		t.Error("/metrics has per-service counters; they belong on /metrics/services only")
	}
	for _, name := range []string{
		"kubeproxy_sync_proxy_rules_last_timestamp_seconds",
		`kubeproxy_sync_proxy_rules_service_changes_total`,
		`kubeproxy_sync_proxy_rules_endpoint_changes_total`,
	} {
		if v := metricValue(m, name); v <= 0 {
			t.Errorf("%s = %v, want > 0 after services and slices were created", name, v)
		}
	}
}

// servicePackets returns nftproxy_service_packets_total of one service's "http" port,
// from /metrics/services.
func (e *env) servicePackets(t *testing.T, name string) float64 {
	t.Helper()
	return metricValue(e.scrapePath(t, "/metrics/services"), `nftproxy_service_packets_total{namespace="default",port="http",service="`+name+`"}`)
}

// scrape reads the running nftproxy's /metrics.
func (e *env) scrape(t *testing.T) string {
	t.Helper()
	return e.scrapePath(t, "/metrics")
}

func (e *env) scrapePath(t *testing.T, path string) string {
	t.Helper()
	out, err := e.c.Exec(t.Context(), e.c.NodeNS, "curl", "-sf", "http://127.0.0.1:10249"+path)
	if err != nil {
		t.Fatalf("scraping %s: %v: %s", path, err, out)
	}
	return string(out)
}

// metricValue sums the samples whose series starts with name (a bare metric name
// matches every label set; a name with labels matches those exactly).
func metricValue(metrics, name string) float64 {
	var sum float64
	for _, line := range strings.Split(metrics, "\n") {
		series, value, ok := strings.Cut(line, " ")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		if series == name || (!strings.Contains(name, "{") && strings.HasPrefix(series, name+"{")) {
			v, err := strconv.ParseFloat(value, 64)
			if err == nil {
				sum += v
			}
		}
	}
	return sum
}

// testExplain runs "nftproxy explain" in the node against the live API for a service
// with two endpoints and one without endpoints.
func (e *env) testExplain(t *testing.T) {
	svc := e.createService(t, "explained", corev1.ServiceTypeClusterIP, nil, tcpPort("http", 80, 8080))
	e.putSlice(t, svc, endpoint(e.web[0], ready), endpoint(e.web[1], ready))
	empty := e.createService(t, "unexplained", corev1.ServiceTypeClusterIP, nil, tcpPort("http", 80, 8080))
	explain := func(args ...string) string {
		t.Helper()
		base := []string{e.bin, "explain", "--kubeconfig", e.c.LeastPrivilegeKubeconfigT(t), "--hostname-override", e.c.NodeName, "--cluster-cidr", clusterCIDR}
		out, err := e.c.Exec(t.Context(), e.c.NodeNS, append(base, args...)...)
		if err != nil {
			t.Fatalf("explain %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	out := explain("--from", e.client.IP.String(), hostPort(svc.Spec.ClusterIP, 80))
	for _, want := range []string{"service default/explained", hostPort(e.web[0].IP.String(), 8080), hostPort(e.web[1].IP.String(), 8080), "50%"} {
		if !strings.Contains(out, want) {
			t.Errorf("explain of a 2-endpoint ClusterIP lacks %q:\n%s", want, out)
		}
	}
	out = explain(hostPort(empty.Spec.ClusterIP, 80))
	if !regexp.MustCompile(`(?i)rejected.*no endpoints`).MatchString(out) {
		t.Errorf("explain of a service without endpoints does not say it is rejected for lack of endpoints:\n%s", out)
	}
}

// testRestart kills nftproxy with SIGKILL while a client opens new connections to a
// ClusterIP every 20 ms, leaves the node without a proxy for a second, and starts a new
// one, which takes the table over in one transaction: not one connection may fail.
func (e *env) testRestart(t *testing.T) {
	svc := e.createService(t, "restart", corev1.ServiceTypeClusterIP, nil, tcpPort("http", 80, 8080))
	e.putSlice(t, svc, endpoint(e.web[0], ready), endpoint(e.web[1], ready))
	addr := hostPort(svc.Spec.ClusterIP, 80)
	e.waitOK(t, "restart answers", e.client.NS, "tcp", addr)

	const attempts = 200
	run, err := e.c.StartProbe(t.Context(), e.client.NS, cluster.ProbeSpec{Proto: "tcp", Addr: addr, Count: attempts, Timeout: time.Second, Interval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	e.proxy.Kill()
	time.Sleep(time.Second) // no proxy at all: the kernel keeps the rules
	e.proxy, err = e.c.StartProcess(e.c.NodeNS, "nftproxy-restarted", append([]string{e.bin}, e.args...)...)
	if err != nil {
		t.Fatal(err)
	}
	e.waitFirstSync(t)
	select {
	case <-run.Done():
	case <-time.After(time.Minute):
		t.Fatal("probe did not finish within a minute")
	}
	res, err := run.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != attempts {
		t.Fatalf("%d attempts recorded, want %d", len(res), attempts)
	}
	expectAnswered(t, "connections across kill -9 and restart", res, e.web[:2], is(e.client.IP.String()))
	if span := res[len(res)-1].At.Sub(res[0].At); span < 3*time.Second {
		t.Errorf("the probe ran for %v only: it did not cover the restart", span)
	}
}
