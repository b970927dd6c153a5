package realcluster

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// checkMetricsService scrapes every nftproxy through the chart's metrics Service (its
// EndpointSlices, as Prometheus' endpoints discovery does) from the control-plane
// namespace: one ready endpoint per node at the node's address, each serving
// kube-proxy's metrics with a successful sync. Then an EndpointSlice change (the web
// Deployment scaled to 2) must show in kubeproxy_network_programming_duration_seconds,
// and every series the chart's dashboard and alert rules select must be among those the
// proxies serve (bin/promqlcheck).
func checkMetricsService(t *testing.T, c *Cluster) {
	t.Helper()
	ctx := t.Context()
	var eps []MetricsEndpoint
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		eps, err = c.MetricsEndpoints(ctx, "kube-system", "nftproxy-metrics")
		if err == nil && len(eps) == len(c.Nodes) || time.Now().After(deadline) {
			if err != nil {
				t.Fatal(err)
			}
			break
		}
		time.Sleep(time.Second)
	}
	byNode := map[string]string{}
	for _, e := range eps {
		byNode[e.Node] = e.Addr
	}
	for i, n := range c.Nodes {
		if want := NodeIP(i+1) + ":10249"; byNode[n.Name] != want {
			t.Fatalf("metrics Service endpoints %+v: want %s for %s (one per node, the node's address)", eps, want, n.Name)
		}
	}

	scrapeAll := func() map[string]string {
		out := map[string]string{}
		for node, addr := range byNode {
			body, err := c.Scrape(ctx, addr)
			if err != nil {
				t.Fatalf("%s: %v", node, err)
			}
			out[node] = body
		}
		return out
	}
	for node, body := range scrapeAll() {
		last := sampleValue(body, `kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}`)
		if last <= 0 || !strings.Contains(body, "nftproxy_build_info{") {
			t.Errorf("%s (%s): no successful sync in /metrics (last sync %v) or no nftproxy_build_info", node, byNode[node], last)
		} else {
			t.Logf("%s: scraped %s through the metrics Service: last sync %s", node, byNode[node], time.Unix(int64(last), 0).UTC().Format(time.TimeOnly))
		}
	}

	// One timed EndpointSlice change: a second web pod.
	scale, err := c.Client.AppsV1().Deployments("default").GetScale(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	scale.Spec.Replicas = 2
	if _, err := c.Client.AppsV1().Deployments("default").UpdateScale(ctx, "web", scale, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var bodies map[string]string
	deadline = time.Now().Add(90 * time.Second)
	for {
		bodies = scrapeAll()
		timed := 0
		for _, b := range bodies {
			if sampleValue(b, `kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"}`) > 0 {
				timed++
			}
		}
		if timed == len(bodies) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("web scaled to 2: after 90 s %d of %d proxies have a network programming observation", timed, len(bodies))
		}
		time.Sleep(2 * time.Second)
	}
	for node, b := range bodies {
		n := sampleValue(b, `kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"}`)
		sum := sampleValue(b, `kubeproxy_network_programming_duration_seconds_sum{ip_family="IPv4"}`)
		t.Logf("%s: network programming: %v changes, %.2f s on average", node, n, sum/n)
	}

	// The dashboard's and the rules' series against what the proxies really serve.
	names := map[string]bool{"up": true} // Prometheus adds it to every target
	for _, b := range bodies {
		for _, n := range exposedSeries(b) {
			names[n] = true
		}
	}
	var list []string
	for n := range names {
		list = append(list, n)
	}
	sort.Strings(list)
	file := filepath.Join(c.WorkDir, "scraped-series.txt")
	if err := os.WriteFile(file, []byte(strings.Join(list, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := promqlCheck(ctx, file, filepath.Join(ChartDir(), "files", "nftproxy-dashboard.json"), filepath.Join(ChartDir(), "files", "nftproxy.rules.yaml"))
	if err != nil {
		t.Errorf("the chart's dashboard or rules select series the running proxies do not serve: %v\n%s", err, out)
	} else {
		t.Logf("dashboard and rules against the scraped series: %s", strings.TrimSpace(out))
	}
}

func promqlCheck(ctx context.Context, names string, files ...string) (string, error) {
	if _, err := helmBinary(ctx); err != nil { // install-tools.sh builds promqlcheck too
		return "", err
	}
	bin := filepath.Join(filepath.Dir(e2eDir()), "bin", "promqlcheck")
	out, err := exec.CommandContext(ctx, bin, append([]string{"-metrics", names}, files...)...).CombinedOutput()
	return string(out), err
}

// sampleValue returns the value of the sample series (name{labels} exactly as
// exposed) in a Prometheus text exposition, -1 if absent.
func sampleValue(text, series string) float64 {
	for _, l := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(strings.Fields(v)[0], 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

// exposedSeries lists the series names of a text exposition from its TYPE lines
// (histograms as _bucket, _sum and _count).
func exposedSeries(text string) []string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		f := strings.Fields(l)
		if len(f) != 4 || f[0] != "#" || f[1] != "TYPE" {
			continue
		}
		switch f[3] {
		case "histogram":
			out = append(out, f[2]+"_bucket", f[2]+"_sum", f[2]+"_count")
		case "summary":
			out = append(out, f[2], f[2]+"_sum", f[2]+"_count")
		default:
			out = append(out, f[2])
		}
	}
	return out
}
