package manifests

import (
	"io"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/metrics"
	"github.com/nftproxy/nftproxy/internal/version"
)

// exportedSeries returns the series names nftproxy's /metrics serves, from its metrics
// registry built as cmd/nftproxy builds it (component-base's registry for client-go's,
// the Go and the process metrics, and the build info), after one event of each kind,
// so that every labelled family has a series. Histograms count as their _bucket, _sum
// and _count series, summaries as the name, _sum and _count.
func exportedSeries(t *testing.T) []string {
	t.Helper()
	rec := metrics.New(metrics.Options{Also: metrics.Legacy(), NoRuntimeMetrics: true})
	rec.Registry().MustRegister(version.NewCollector())
	rec.Changes(1, 1)
	rec.SyncStarted()
	rec.SyncDone(true, 30*time.Millisecond, 10*time.Millisecond)
	rec.Changes(1, 0)
	rec.SyncStarted()
	rec.SyncDone(false, 3*time.Millisecond, time.Millisecond)
	rec.SyncFailed(false, time.Millisecond)
	rec.Programmed(metrics.IPv4, 2*time.Second)
	rec.NoLocalEndpoints(metrics.IPv4, 1, 1)
	rec.ConntrackReconciled(metrics.IPv4, time.Millisecond, 1)
	rec.ServicePorts(3)
	rec.ForeignChange(false)
	rec.Repaired(false)
	rec.RepairBackoff(time.Second)

	srv := httptest.NewServer(rec.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return seriesNames(string(body))
}

// seriesNames lists the series names of a Prometheus text exposition, from its
// "# TYPE name type" lines.
func seriesNames(text string) []string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		f := strings.Fields(l)
		if len(f) != 4 || f[0] != "#" || f[1] != "TYPE" {
			continue
		}
		switch name := f[2]; f[3] {
		case "histogram":
			out = append(out, name+"_bucket", name+"_sum", name+"_count")
		case "summary":
			out = append(out, name, name+"_sum", name+"_count")
		default:
			out = append(out, name)
		}
	}
	return out
}

// promqlCheck runs bin/promqlcheck (Prometheus' PromQL parser; e2e/hack/promqlcheck)
// on files with the series names and returns its output and whether it passed.
func promqlCheck(t *testing.T, names []string, files ...string) (string, bool) {
	t.Helper()
	list := filepath.Join(t.TempDir(), "names.txt")
	if err := os.WriteFile(list, []byte(strings.Join(names, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(tool(t, "promqlcheck", "PROMQLCHECK"), append([]string{"-metrics", list}, files...)...).CombinedOutput()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatal(err)
	}
	return string(out), err == nil
}

// TestMonitoringUsesExportedMetrics: every selector of every query of the dashboard and
// every expression of the alert rules names a series nftproxy exports (or up, which
// Prometheus adds to every target).
func TestMonitoringUsesExportedMetrics(t *testing.T) {
	names := exportedSeries(t)
	for _, must := range []string{"kubeproxy_sync_proxy_rules_duration_seconds_bucket", "nftproxy_dataplane_repair_backoff_seconds",
		"kubeproxy_network_programming_duration_seconds_bucket", "process_resident_memory_bytes", "nftproxy_build_info"} {
		if !slices.Contains(names, must) {
			t.Fatalf("the registry does not export %s: %q", must, names)
		}
	}
	out, ok := promqlCheck(t, append(names, "up"),
		filepath.Join(chartDir, "files", "nftproxy-dashboard.json"), filepath.Join(chartDir, "files", "nftproxy.rules.yaml"))
	t.Logf("promqlcheck: %s", strings.TrimSpace(out))
	if !ok {
		t.Errorf("the dashboard or the rules use series nftproxy does not export:\n%s", out)
	}
}

// The check can fail: a rule on a metric nftproxy does not export, an unparsable
// expression and a selector without a metric name are each reported.
func TestPromqlCheckCatchesUnknownMetrics(t *testing.T) {
	dir := t.TempDir()
	rules := filepath.Join(dir, "bad.rules.yaml")
	os.WriteFile(rules, []byte(`groups:
  - name: bad
    rules:
      - alert: Misspelt
        expr: rate(kubeproxy_sync_proxy_rules_nftables_sync_failure_total[5m]) > 0
      - alert: Unparsable
        expr: rate(up[5m) > 0
      - alert: Nameless
        expr: '{job="nftproxy"} > 0'
`), 0o644)
	dash := filepath.Join(dir, "bad.json")
	os.WriteFile(dash, []byte(`{"panels": [{"title": "p", "targets": [{"refId": "A", "expr": "sum(rate(nftproxy_sync_kernel_duration_seconds_count{job=\"$job\"}[$__rate_interval])) / nftproxy_no_such_thing"}]}],
 "templating": {"list": [{"name": "instance", "type": "query", "query": {"query": "label_values(nftproxy_not_exported{job=\"$job\"}, instance)"}}]}}`), 0o644)
	out, ok := promqlCheck(t, exportedSeries(t), rules, dash)
	if ok {
		t.Fatalf("promqlcheck passed bad files:\n%s", out)
	}
	for _, want := range []string{
		"rule Misspelt: metric kubeproxy_sync_proxy_rules_nftables_sync_failure_total is not exported",
		"rule Unparsable: ",
		"rule Nameless: selector",
		`panel "p" target A: metric nftproxy_no_such_thing is not exported`,
		"variable instance: metric nftproxy_not_exported is not exported",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("promqlcheck output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "nftproxy_sync_kernel_duration_seconds_count is not") {
		t.Errorf("an exported series was reported:\n%s", out)
	}
}
