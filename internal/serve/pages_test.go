package serve

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/serve/httplimit"
)

func get(t *testing.T, h http.Handler, path string) (int, string, http.Header) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Body.String(), rec.Header()
}

func pages(profiling bool) MetricsPages {
	started := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	return MetricsPages{
		Metrics:  http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "metric 1\n") }),
		Services: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "per-service 2\n") }),
		Config:   map[string]any{"clusterCIDR": "10.244.0.0/16", "mode": "nftables"},
		Flags: func() map[string]string {
			return map[string]string{"v": "2", "cluster-cidr": "10.244.0.0/16", "profiling": "false"}
		},
		Started:   started,
		Version:   "v1.2.3",
		Profiling: profiling,
		Now:       func() time.Time { return started.Add(time.Hour + 61*time.Second) },
	}
}

// TestMetricsPages: every page kube-proxy's metrics server has, in its shape.
func TestMetricsPages(t *testing.T) {
	h := pages(false).Handler()
	if code, body, _ := get(t, h, "/metrics"); code != 200 || body != "metric 1\n" {
		t.Errorf("/metrics: %d %q", code, body)
	}
	if code, body, _ := get(t, h, "/metrics/services"); code != 200 || body != "per-service 2\n" {
		t.Errorf("/metrics/services: %d %q", code, body)
	}
	if code, body, _ := get(t, h, "/proxyMode"); code != 200 || body != "nftables" {
		t.Errorf("/proxyMode: %d %q", code, body)
	}
	if code, body, _ := get(t, h, "/healthz"); code != 200 || body != "ok" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	code, body, hdr := get(t, h, "/configz")
	var cz map[string]map[string]any
	if err := json.Unmarshal([]byte(body), &cz); code != 200 || err != nil || hdr.Get("Content-Type") != "application/json" ||
		cz["kubeproxy.config.k8s.io"]["clusterCIDR"] != "10.244.0.0/16" {
		t.Errorf("/configz: %d %q %v", code, body, err)
	}

	code, body, _ = get(t, h, "/flagz")
	want := "\nnftproxy flagz\n" + zpageWarning + "\n\ncluster-cidr: 10.244.0.0/16\nprofiling: false\nv: 2\n"
	if code != 200 || body != want {
		t.Errorf("/flagz: %d\n%s\nwant\n%s", code, body, want)
	}

	code, body, _ = get(t, h, "/statusz")
	want = "\nnftproxy statusz\n" + zpageWarning + "\n\n" +
		"Started: Tue Nov 24 12:00:00 UTC 2026\nUp: 1 hr 01 min 01 sec\nGo version: " + runtime.Version() + "\n" +
		"Binary version: v1.2.3\nPaths: /configz /flagz /healthz /metrics /metrics/services /proxyMode /statusz\n"
	if code != 200 || body != want {
		t.Errorf("/statusz: %d\n%s\nwant\n%s", code, body, want)
	}

	// the per-service counters off: 404, saying why, and not listed
	off := pages(false)
	off.Services = nil
	code, body, _ = get(t, off.Handler(), "/metrics/services")
	if code != http.StatusNotFound || !strings.Contains(body, "--service-counters=false") {
		t.Errorf("/metrics/services with the counters off: %d %q", code, body)
	}
	if _, body, _ := get(t, off.Handler(), "/statusz"); strings.Contains(body, "/metrics/services") {
		t.Errorf("/statusz lists /metrics/services with the counters off:\n%s", body)
	}

	// profiling is off by default, and no /flagz without flags
	if code, _, _ := get(t, h, "/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("/debug/pprof/ without --profiling: %d", code)
	}
	if code, _, _ := get(t, MetricsMux(http.NotFoundHandler(), nil), "/flagz"); code != http.StatusNotFound {
		t.Errorf("/flagz without flags: %d", code)
	}
}

// TestProfilingPages: with --profiling, Go's profiles are served on the metrics
// server, through its limits (a real server from Start with httplimit.Metrics).
func TestProfilingPages(t *testing.T) {
	h := pages(true).Handler()
	if code, body, _ := get(t, h, "/debug/pprof/"); code != 200 || !strings.Contains(body, "goroutine") {
		t.Errorf("/debug/pprof/: %d %q", code, body)
	}
	if code, _, hdr := get(t, h, "/debug/pprof"); code != http.StatusFound || hdr.Get("Location") != "/debug/pprof/" {
		t.Errorf("/debug/pprof: %d %v", code, hdr)
	}
	if _, body, _ := get(t, h, "/statusz"); !strings.Contains(body, "Paths: /configz /debug/pprof /flagz") {
		t.Errorf("/statusz does not list /debug/pprof:\n%s", body)
	}

	addr := startMetrics(t, h, httplimit.Metrics)
	for _, path := range []string{"/debug/pprof/goroutine?debug=1", "/debug/pprof/heap", "/debug/pprof/profile?seconds=1", "/debug/pprof/cmdline"} {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != 200 || len(body) == 0 {
			t.Errorf("%s: %d, %d bytes", path, resp.StatusCode, len(body))
		}
	}
	// a profile longer than MaxProfileSeconds is refused: Go would extend the
	// connection's write deadline by as much
	for _, path := range []string{"/debug/pprof/profile?seconds=120", "/debug/pprof/trace?seconds=1e9", "/debug/pprof/profile?seconds=NaN"} {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: %d", path, resp.StatusCode)
		}
	}
}
