package metrics

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }
func (c *fakeClock) set(sec int64)  { c.t = time.Unix(sec, 0) }

func scrape(t *testing.T, h http.Handler) string {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	req.Header.Set("Accept", "text/plain")
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("scrape: %d %s", rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("Content-Type %q", ct)
	}
	return rec.Body.String()
}

// expect checks that every line is in the scrape, exactly.
func expect(t *testing.T, body string, lines ...string) {
	t.Helper()
	have := map[string]bool{}
	for _, l := range strings.Split(body, "\n") {
		have[l] = true
	}
	for _, l := range lines {
		if !have[l] {
			t.Errorf("missing line: %s", l)
		}
	}
	if t.Failed() {
		t.Logf("scrape:\n%s", body)
	}
}

func TestRecorderValuesAfterKnownSequence(t *testing.T) {
	clk := &fakeClock{}
	p := New(Options{Now: clk.now, NoRuntimeMetrics: true})

	clk.set(1000)
	p.Changes(2, 1)
	clk.set(1001)
	p.Changes(1, 0)
	mid := scrape(t, p.Handler())
	expect(t, mid,
		`kubeproxy_sync_proxy_rules_endpoint_changes_pending 3`,
		`kubeproxy_sync_proxy_rules_service_changes_pending 1`,
		`kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv4"} 1001`,
		// Failures and sync durations exist at 0 before any sync.
		`kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv4"} 0`,
		`kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv6"} 0`,
		`nftproxy_dataplane_repairs_total{cause="foreign_change"} 0`,
		`nftproxy_dataplane_repairs_total{cause="events_lost"} 0`,
		`nftproxy_dataplane_foreign_changes_total{cause="foreign_change"} 0`,
		`nftproxy_dataplane_repair_backoff_seconds 0`,
	)
	p.SyncStarted()
	clk.set(1002)
	p.SyncDone(false, 250*time.Millisecond, 125*time.Millisecond)
	p.Changes(0, 2)
	p.SyncStarted()
	clk.set(1003)
	p.SyncFailed(true, 500*time.Millisecond)
	clk.set(1004)
	p.SyncDone(true, 125*time.Millisecond, 62500*time.Microsecond)
	for _, fam := range []string{IPv4, IPv6} {
		p.Programmed(fam, 1500*time.Millisecond)
		p.Programmed(fam, 70*time.Second)
	}
	p.ServicePorts(7)
	p.Probe("/healthz", 200)
	p.Probe("/healthz", 200)
	p.Probe("/healthz", 503)
	p.Probe("/livez", 200)
	p.Repaired(false)
	p.Repaired(false)
	p.Repaired(true)
	for range 5 {
		p.ForeignChange(false)
	}
	p.ForeignChange(true)
	p.RepairBackoff(4 * time.Second)

	body := scrape(t, p.Handler())
	for _, fam := range []string{"IPv4", "IPv6"} {
		l := `{ip_family="` + fam + `"`
		expect(t, body,
			`kubeproxy_sync_proxy_rules_duration_seconds_bucket`+l+`,le="0.064"} 0`,
			`kubeproxy_sync_proxy_rules_duration_seconds_bucket`+l+`,le="0.128"} 1`,
			`kubeproxy_sync_proxy_rules_duration_seconds_bucket`+l+`,le="0.256"} 2`,
			`kubeproxy_sync_proxy_rules_duration_seconds_bucket`+l+`,le="0.512"} 3`,
			`kubeproxy_sync_proxy_rules_duration_seconds_bucket`+l+`,le="16.384"} 3`,
			`kubeproxy_sync_proxy_rules_duration_seconds_bucket`+l+`,le="+Inf"} 3`,
			`kubeproxy_sync_proxy_rules_duration_seconds_sum`+l+`} 0.875`,
			`kubeproxy_sync_proxy_rules_duration_seconds_count`+l+`} 3`,
			`kubeproxy_sync_partial_proxy_rules_duration_seconds_bucket`+l+`,le="0.256"} 1`,
			`kubeproxy_sync_partial_proxy_rules_duration_seconds_sum`+l+`} 0.25`,
			`kubeproxy_sync_partial_proxy_rules_duration_seconds_count`+l+`} 1`,
			`kubeproxy_sync_full_proxy_rules_duration_seconds_bucket`+l+`,le="0.128"} 1`,
			`kubeproxy_sync_full_proxy_rules_duration_seconds_bucket`+l+`,le="0.256"} 1`,
			`kubeproxy_sync_full_proxy_rules_duration_seconds_bucket`+l+`,le="0.512"} 2`,
			`kubeproxy_sync_full_proxy_rules_duration_seconds_sum`+l+`} 0.625`,
			`kubeproxy_sync_full_proxy_rules_duration_seconds_count`+l+`} 2`,
			`kubeproxy_sync_proxy_rules_last_timestamp_seconds`+l+`} 1004`,
			`kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds`+l+`} 1002`,
			`kubeproxy_sync_proxy_rules_nftables_sync_failures_total`+l+`} 1`,
			`kubeproxy_network_programming_duration_seconds_bucket`+l+`,le="1"} 0`,
			`kubeproxy_network_programming_duration_seconds_bucket`+l+`,le="2"} 1`,
			`kubeproxy_network_programming_duration_seconds_bucket`+l+`,le="65"} 1`,
			`kubeproxy_network_programming_duration_seconds_bucket`+l+`,le="70"} 2`,
			`kubeproxy_network_programming_duration_seconds_bucket`+l+`,le="300"} 2`,
			`kubeproxy_network_programming_duration_seconds_sum`+l+`} 71.5`,
			`kubeproxy_network_programming_duration_seconds_count`+l+`} 2`,
		)
	}
	expect(t, body,
		`# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram`,
		`# TYPE kubeproxy_sync_proxy_rules_endpoint_changes_total counter`,
		`# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge`,
		`kubeproxy_sync_proxy_rules_endpoint_changes_pending 0`,
		`kubeproxy_sync_proxy_rules_endpoint_changes_total 3`,
		`kubeproxy_sync_proxy_rules_service_changes_pending 0`,
		`kubeproxy_sync_proxy_rules_service_changes_total 3`,
		`nftproxy_sync_kernel_duration_seconds_bucket{le="0.064"} 1`,
		`nftproxy_sync_kernel_duration_seconds_bucket{le="0.128"} 2`,
		`nftproxy_sync_kernel_duration_seconds_sum 0.1875`,
		`nftproxy_sync_kernel_duration_seconds_count 2`,
		`nftproxy_service_ports 7`,
		`kubeproxy_proxy_healthz_total{code="200"} 2`,
		`kubeproxy_proxy_healthz_total{code="503"} 1`,
		`kubeproxy_proxy_livez_total{code="200"} 1`,
		`# TYPE nftproxy_dataplane_repairs_total counter`,
		`nftproxy_dataplane_repairs_total{cause="foreign_change"} 2`,
		`nftproxy_dataplane_repairs_total{cause="events_lost"} 1`,
		`nftproxy_dataplane_foreign_changes_total{cause="foreign_change"} 5`,
		`nftproxy_dataplane_foreign_changes_total{cause="events_lost"} 1`,
		`# TYPE nftproxy_dataplane_repair_backoff_seconds gauge`,
		`nftproxy_dataplane_repair_backoff_seconds 4`,
	)
	if strings.Contains(body, "go_goroutines") {
		t.Error("runtime metrics present with NoRuntimeMetrics")
	}
}

// kube-proxy's bucket boundaries, so histogram_quantile over old and new series agree.
func TestBuckets(t *testing.T) {
	if len(syncBuckets) != 15 || syncBuckets[0] != 0.001 || syncBuckets[14] != 16.384 {
		t.Errorf("sync buckets %v", syncBuckets)
	}
	b := programmingBuckets()
	if len(b) != 2+59+12+7 || b[0] != 0.25 || b[1] != 0.5 || b[2] != 1 || b[60] != 59 || b[61] != 60 || b[72] != 115 || b[73] != 120 || b[len(b)-1] != 300 {
		t.Errorf("programming buckets %v", b)
	}
}

func TestRuntimeMetricsOnOwnRegistry(t *testing.T) {
	p := New(Options{})
	body := scrape(t, p.Handler())
	expect(t, body, `# TYPE go_goroutines gauge`)
	// Two recorders do not share a registry (no global state).
	q := New(Options{NoRuntimeMetrics: true})
	p.ServicePorts(3)
	expect(t, scrape(t, q.Handler()), `nftproxy_service_ports 0`)
}

func TestNopIsARecorder(t *testing.T) {
	var r Recorder = Nop{}
	r.Changes(1, 1)
	r.SyncStarted()
	r.SyncDone(true, time.Second, time.Second)
	r.SyncFailed(false, time.Second)
	r.Programmed(IPv4, time.Second)
	r.NoLocalEndpoints(IPv4, 1, 1)
	r.ConntrackReconciled(IPv6, time.Second, 1)
	r.ServicePorts(1)
	r.Repaired(true)
	r.ForeignChange(true)
	r.RepairBackoff(time.Second)
}

// TestUpstreamSyncMetrics: the no-local-endpoints gauge, the conntrack reconciler's
// histogram and counter, and programming latency per family, under kube-proxy's names
// and labels.
func TestUpstreamSyncMetrics(t *testing.T) {
	p := New(Options{NoRuntimeMetrics: true})
	expect(t, scrape(t, p.Handler()),
		`kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family="IPv4"} 0`,
		`kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family="IPv6"} 0`,
	)
	p.NoLocalEndpoints(IPv4, 2, 1)
	p.NoLocalEndpoints(IPv6, 0, 3)
	p.NoLocalEndpoints(IPv4, 1, 0) // a gauge: the last sync's count
	p.ConntrackReconciled(IPv4, 3*time.Millisecond, 4)
	p.ConntrackReconciled(IPv4, 0, 0)
	p.ConntrackReconciled(IPv6, 40*time.Millisecond, 2)
	p.Programmed(IPv6, 2*time.Second)
	body := scrape(t, p.Handler())
	expect(t, body,
		`# TYPE kubeproxy_sync_proxy_rules_no_local_endpoints_total gauge`,
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="internal"} 1`,
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="external"} 0`,
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv6",traffic_policy="internal"} 0`,
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv6",traffic_policy="external"} 3`,
		`# TYPE kubeproxy_conntrack_reconciler_sync_duration_seconds histogram`,
		`kubeproxy_conntrack_reconciler_sync_duration_seconds_bucket{ip_family="IPv4",le="0.001"} 1`,
		`kubeproxy_conntrack_reconciler_sync_duration_seconds_bucket{ip_family="IPv4",le="0.004"} 2`,
		`kubeproxy_conntrack_reconciler_sync_duration_seconds_count{ip_family="IPv4"} 2`,
		`kubeproxy_conntrack_reconciler_sync_duration_seconds_count{ip_family="IPv6"} 1`,
		`# TYPE kubeproxy_conntrack_reconciler_deleted_entries_total counter`,
		`kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family="IPv4"} 4`,
		`kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family="IPv6"} 2`,
		`kubeproxy_network_programming_duration_seconds_count{ip_family="IPv6"} 1`,
	)
	if strings.Contains(body, `kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"}`) {
		t.Error("an IPv6 latency was recorded under IPv4 too")
	}
}

// TestLegacyRegistryServed: with Also = Legacy(), one scrape has client-go's
// rest_client_* families (as kube-proxy's /metrics) besides ours, and each family once
// even where both registries have it (go_*, process_*).
func TestLegacyRegistryServed(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"NamespaceList","apiVersion":"v1","items":[]}`))
	}))
	defer api.Close()
	client, err := kubernetes.NewForConfig(&rest.Config{Host: api.URL})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Namespaces().List(context.Background(), metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	p := New(Options{Also: Legacy(), NoRuntimeMetrics: true})
	body := scrape(t, p.Handler())
	expect(t, body,
		`# TYPE rest_client_requests_total counter`,
		`# TYPE rest_client_request_duration_seconds histogram`,
		`# TYPE rest_client_rate_limiter_duration_seconds histogram`,
		`rest_client_requests_total{code="200",host="`+strings.TrimPrefix(api.URL, "http://")+`",method="GET"} 1`,
		`# TYPE go_goroutines gauge`,
		`# TYPE process_start_time_seconds gauge`,
		`# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram`,
	)
	seen := map[string]int{}
	for _, l := range strings.Split(body, "\n") {
		if name, ok := strings.CutPrefix(l, "# TYPE "); ok {
			name, _, _ = strings.Cut(name, " ")
			seen[name]++
			if seen[name] == 2 {
				t.Errorf("family %s served twice", name)
			}
		}
	}
	// our runtime collectors too: still each family once
	body = scrape(t, New(Options{Also: Legacy()}).Handler())
	if n := strings.Count(body, "# TYPE go_goroutines "); n != 1 {
		t.Errorf("go_goroutines served %d times", n)
	}
	// without Also, none of them
	if body := scrape(t, New(Options{NoRuntimeMetrics: true}).Handler()); strings.Contains(body, "rest_client_") {
		t.Error("rest_client_* served without Also")
	}
}

type failingGatherer struct{}

func (failingGatherer) Gather() ([]*dto.MetricFamily, error) {
	name, help := "other_metric", "x"
	return []*dto.MetricFamily{{Name: &name, Help: &help, Type: dto.MetricType_GAUGE.Enum(),
		Metric: []*dto.Metric{{Gauge: &dto.Gauge{Value: new(float64)}}}}}, errors.New("broken collector")
}

// TestAlsoErrorDoesNotFailScrape: an error of the other registry leaves our metrics,
// and what it did gather, served.
func TestAlsoErrorDoesNotFailScrape(t *testing.T) {
	p := New(Options{Also: failingGatherer{}, NoRuntimeMetrics: true})
	p.ServicePorts(2)
	expect(t, scrape(t, p.Handler()), `nftproxy_service_ports 2`, `other_metric 0`)
}

// nftproxy_services_set_aside exists at 0 for each family from the start (an alert on
// it works before any Service is over a limit) and follows SetAside per family.
func TestSetAsideGauge(t *testing.T) {
	p := New(Options{NoRuntimeMetrics: true})
	expect(t, scrape(t, p.Handler()),
		`# TYPE nftproxy_services_set_aside gauge`,
		`nftproxy_services_set_aside{ip_family="IPv4"} 0`,
		`nftproxy_services_set_aside{ip_family="IPv6"} 0`)
	p.SetAside(IPv4, 3)
	p.SetAside(IPv6, 1)
	p.SetAside(IPv4, 2)
	expect(t, scrape(t, p.Handler()),
		`nftproxy_services_set_aside{ip_family="IPv4"} 2`,
		`nftproxy_services_set_aside{ip_family="IPv6"} 1`)
}
