package metrics

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
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
	p.Programmed(1500 * time.Millisecond)
	p.Programmed(70 * time.Second)
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
	r.Programmed(time.Second)
	r.ServicePorts(1)
	r.Repaired(true)
	r.ForeignChange(true)
	r.RepairBackoff(time.Second)
}
