package bench

import (
	"bytes"
	"fmt"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/e2e/cluster"
)

// TestSideBySide is `make bench`'s full run (about an hour): NFTPROXY_BENCH=1, as root.
//
//	BENCH_SIZES       service counts (default 1000,10000,30000,5000x50): N (10 endpoints each) or
//	                  NxE (E endpoints each, nftproxy and kube-proxy nftables only)
//	BENCH_BIG         nftproxy alone at this many services × 5 endpoints (default 50000; 0: none)
//	BENCH_CHURN_SIZE  N of the churn measurement (default 10000; must be in BENCH_SIZES)
//	BENCH_PROXIES     comma-separated subset of nftproxy,kube-proxy-nftables,kube-proxy-iptables
//	                  (default: these three), or nftproxy-list (see Proxies)
//	BENCH_OUT         output directory (default docs/bench of the repository)
//	BENCH_BOUND       per cold start (default 10m)
//	BENCH_SCENARIOS   comma-separated subset of footprint,datapath,onechange,expose,burst,churn (default all)
//	BENCH_EXPOSE_REPEATS  new Service + EndpointSlice pairs per proxy and N (default 20)
//	BENCH_BURST_ROUNDS    bursts of 10 Services 100 ms apart per proxy and N, quiet and under churn (default 2)
//	BENCH_NFTPROXY_BIN    a prebuilt nftproxy to measure instead of building the tree
//	BENCH_HEAP_PROFILE    if set: nftproxy runs with --profiling, and its heap profile at the
//	                      end of each size's measurements is saved in BENCH_OUT
func TestSideBySide(t *testing.T) {
	if os.Getenv("NFTPROXY_BENCH") != "1" {
		t.Skip("set NFTPROXY_BENCH=1 to run the side-by-side benchmark (root; about an hour at full size)")
	}
	if err := cluster.CheckPrerequisites(); err != nil {
		t.Fatal(err)
	}
	sizes, wide := sizesEnv(t, "BENCH_SIZES", "1000,10000,30000,5000x50", 10)
	o := Options{
		Sizes: sizes, Endpoints: 10, Wide: wide,
		SmallSize: 10,
		BigSize:   intEnv(t, "BENCH_BIG", 50000), BigEndpoints: 5,
		ChurnSize: intEnv(t, "BENCH_CHURN_SIZE", 10000), ChurnRate: 50, ChurnFor: 60 * time.Second,
		Repeats:       10,
		ExposeRepeats: intEnv(t, "BENCH_EXPOSE_REPEATS", 20), ExposeGap: 3 * time.Second,
		Burst:       BurstOpts{Services: 10, Gap: 100 * time.Millisecond, Rounds: intEnv(t, "BENCH_BURST_ROUNDS", 2), Idle: 5 * time.Second},
		DataPathFor: 5 * time.Second, DataPathConc: 4,
		Bound:   durEnv(t, "BENCH_BOUND", 10*time.Minute),
		Samples: 22, ColdStarts: intEnv(t, "BENCH_COLD_STARTS", 3),
		Logf: t.Logf,
	}
	if p := os.Getenv("BENCH_PROXIES"); p != "" {
		o.Proxies = strings.Split(p, ",")
	}
	if sc := os.Getenv("BENCH_SCENARIOS"); sc != "" {
		for _, name := range strings.Split(sc, ",") {
			if !slices.Contains(AllScenarios, name) {
				t.Fatalf("BENCH_SCENARIOS=%q: %q is not one of %v", sc, name, AllScenarios)
			}
			o.Scenarios = append(o.Scenarios, name)
		}
	}
	out := os.Getenv("BENCH_OUT")
	switch {
	case out == "":
		out = filepath.Join(repoRoot(), "docs", "bench")
	case !filepath.IsAbs(out):
		// relative to the repository, not to the package directory go test runs in
		out = filepath.Join(repoRoot(), out)
	}
	if os.Getenv("BENCH_HEAP_PROFILE") != "" {
		o.HeapProfiles = out
	}
	o.Checkpoint = func(r *Results) {
		if err := r.Write(out); err != nil {
			t.Logf("checkpoint: %v", err)
		}
	}
	res := runSuite(t, o)
	if err := res.Write(out); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s/results.{json,md} and chart.png (run took %.1f min)", out, res.Seconds/60)
}

// TestSideBySideSmoke runs every measurement of the suite quickly at N=100 for all three
// proxies, and at 60 services × 20 endpoints (a many-endpoints size: nftproxy and
// kube-proxy nftables) first, and checks the results are sane. It is part of `make e2e`
// (NFTPROXY_E2E=1).
func TestSideBySideSmoke(t *testing.T) {
	cluster.Require(t)
	o := Options{
		Sizes: []int{100}, Endpoints: 10, Wide: []Size{{60, 20}},
		ChurnSize: 100, ChurnRate: 20, ChurnFor: 5 * time.Second,
		Repeats:       2,
		ExposeRepeats: 2, ExposeGap: 2 * time.Second,
		Burst:       BurstOpts{Services: 3, Gap: 100 * time.Millisecond, Rounds: 1, Idle: time.Second},
		DataPathFor: time.Second, DataPathConc: 2,
		Bound:   2 * time.Minute,
		Samples: 8, ColdStarts: 2,
		Logf: t.Logf,
	}
	res := runSuite(t, o)
	// the version of the kube-proxy measured, from its --version (build-k8s.sh stamps it)
	if !regexp.MustCompile(`^Kubernetes v1\.[0-9]+\.[0-9]+`).MatchString(res.Host.KubeProxy) {
		t.Errorf("kube-proxy --version: %q, want Kubernetes v1.x.y", res.Host.KubeProxy)
	}
	want := []string{"nftproxy", "kube-proxy-nftables", "kube-proxy-iptables"}
	if len(res.Runs) != 2*len(want) {
		t.Fatalf("%d runs, want %d", len(res.Runs), 2*len(want))
	}
	for i, r := range res.Runs {
		z := Size{100, 10}
		if i < len(want) {
			z = o.Wide[0]
		}
		if r.Proxy != want[i%len(want)] || r.N != z.N || r.Endpoints != z.Endpoints {
			t.Errorf("run %d: %s %d × %d, want %s %v", i, r.Proxy, r.N, r.Endpoints, want[i%len(want)], z)
		}
		if r.N != 100 {
			if r.Proxy == "kube-proxy-iptables" {
				if r.Skipped == "" {
					t.Errorf("%s at %d × %d: ran, want skipped", r.Proxy, r.N, r.Endpoints)
				}
				continue
			}
			if r.DataPath != nil || r.Churn != nil {
				t.Errorf("%s at %d × %d: data path or churn measured", r.Proxy, r.N, r.Endpoints)
			}
		}
		for _, e := range r.Errors {
			t.Errorf("%s: %s", r.Proxy, e)
		}
		if r.Residue != "" && r.Proxy != "kube-proxy-iptables" { // iptables-nft leaves its tables
			t.Errorf("%s: --cleanup left %s", r.Proxy, r.Residue)
		}
		cs := r.ColdStart
		if cs == nil || cs.TimedOut || cs.Answered != cs.Sampled || cs.Sampled < 2 {
			t.Errorf("%s: cold start %+v: every sampled service must answer", r.Proxy, cs)
			continue
		}
		if !(cs.InformersSynced > 0 && cs.FirstSync > 0 && cs.AllProgrammed > 0 && cs.AllProgrammed < 120) {
			t.Errorf("%s: cold start times %+v", r.Proxy, cs)
		}
		if len(cs.Runs) != o.ColdStarts {
			t.Errorf("%s: %d cold starts %+v, want %d", r.Proxy, len(cs.Runs), cs.Runs, o.ColdStarts)
		} else if lo, hi := min(cs.Runs[0].AllProgrammed, cs.Runs[1].AllProgrammed), max(cs.Runs[0].AllProgrammed, cs.Runs[1].AllProgrammed); !(lo > 0 && cs.AllProgrammed >= lo && cs.AllProgrammed <= hi) {
			t.Errorf("%s: cold start %.3fs is not the median of its runs %+v", r.Proxy, cs.AllProgrammed, cs.Runs)
		}
		if f := r.Footprint; f == nil || f.Tables == 0 || f.Chains == 0 || f.Rules == 0 || f.ListSeconds <= 0 {
			t.Errorf("%s: footprint %+v", r.Proxy, f)
		} else if f.PerService < 1 {
			t.Errorf("%s: %.2f kernel objects per service", r.Proxy, f.PerService)
		}
		if l := r.Expose; l == nil || l.Samples != o.ExposeRepeats || l.Failed != 0 || !(l.P50 > 0 && l.P99 >= l.P50) || l.Syncs < 1 || l.SyncMS <= 0 || l.WriteGapMS <= 0 {
			t.Errorf("%s: expose %+v", r.Proxy, l)
		}
		if b := r.Burst; b == nil {
			t.Errorf("%s: no burst measured", r.Proxy)
		} else {
			for name, br := range map[string]*BurstRun{"quiet": b.Quiet, "under churn": b.Churn} {
				if br == nil || br.Samples != o.Burst.Services*o.Burst.Rounds || br.Failed != 0 || !(br.P50 > 0 && br.P99 >= br.P50) ||
					br.Syncs < 1 || br.SyncMS <= 0 || br.CPUSeconds < 0 || br.Seconds <= 0 {
					t.Errorf("%s: burst %s %+v", r.Proxy, name, br)
				}
			}
			if b.Churn != nil && (b.Churn.ChurnRate != o.ChurnRate || b.Churn.Written == 0) {
				t.Errorf("%s: burst under churn: %d writes at %d/s", r.Proxy, b.Churn.Written, b.Churn.ChurnRate)
			}
		}
		for name, l := range map[string]*Latency{"add-service": r.AddService, "endpoint-change": r.EndpointChange, "endpoint-replaced": r.EndpointReplaced} {
			if l == nil || l.Samples != o.Repeats || l.Failed != 0 || !(l.P50 > 0 && l.P99 >= l.P50) || l.KernelMS <= 0 || l.SyncMS <= 0 {
				t.Errorf("%s: %s %+v", r.Proxy, name, l)
			}
		}
		if r.N != 100 {
			if m := r.Memory; m == nil || m.PeakRSSMiB <= 0 {
				t.Errorf("%s: memory %+v", r.Proxy, m)
			}
			continue
		}
		if c := r.Churn; c == nil || c.Written < int(o.ChurnFor.Seconds())*o.ChurnRate/2 || c.WriteErrors != 0 ||
			c.PacketSamples == 0 || c.PacketFailed != 0 || c.CPUSeconds <= 0 || c.PeakRSSMiB <= 0 || c.ProgCount <= 0 || c.ProgP50 <= 0 {
			t.Errorf("%s: churn %+v", r.Proxy, c)
		}
		if m := r.Memory; m == nil || m.PeakRSSMiB < m.RSSMiB || m.RSSMiB <= 0 {
			t.Errorf("%s: memory %+v", r.Proxy, m)
		}
		if d := r.DataPath; d == nil || d.ClusterIP.OK == 0 || d.PodIP.OK == 0 || d.ClusterIP.P50Millis <= 0 {
			t.Errorf("%s: data path %+v", r.Proxy, d)
		}
	}
	if len(res.Ratios) == 0 {
		t.Error("no ratios")
	}
	dir := t.TempDir()
	if err := res.Write(dir); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "results.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range want {
		if !strings.Contains(string(md), "| "+p+" | 100 × 10 |") || !strings.Contains(string(md), "| "+p+" | 60 × 20 |") {
			t.Errorf("results.md has no row for %s", p)
		}
	}
	if !strings.Contains(string(md), "## Bursts") {
		t.Error("results.md has no burst table")
	}
	b, err := os.ReadFile(filepath.Join(dir, "chart.png"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := png.Decode(bytes.NewReader(b)); err != nil {
		t.Errorf("chart.png: %v", err)
	}
	t.Logf("results.md:\n%s", md)
}

func runSuite(t *testing.T, o Options) *Results {
	t.Helper()
	ctx := t.Context()
	bins, err := BuildBinaries(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if b := os.Getenv("BENCH_NFTPROXY_BIN"); b != "" {
		bins.Nftproxy = b // e.g. an earlier commit's build, for a before/after pair
	}
	// etcd on tmpfs: tens of thousands of writes without fsync cost.
	etcdDir, err := os.MkdirTemp("/dev/shm", "nftproxy-bench-etcd-")
	if err != nil {
		etcdDir = "" // the harness default (on disk)
	} else {
		t.Cleanup(func() { os.RemoveAll(etcdDir) })
	}
	c, err := cluster.Start(ctx, cluster.Config{Logf: t.Logf, EtcdDataDir: etcdDir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	res, err := RunSuite(ctx, c, bins, o)
	if err != nil {
		if res != nil {
			dir := t.TempDir()
			_ = res.Write(dir)
			md, _ := os.ReadFile(filepath.Join(dir, "results.md"))
			t.Logf("partial results:\n%s", md)
		}
		t.Fatal(err)
	}
	return res
}

// sizesEnv parses a comma-separated list of N (eps endpoints per service: sizes) and
// NxE (E endpoints per service: wide).
func sizesEnv(t *testing.T, name, def string, eps int) (sizes []int, wide []Size) {
	v := os.Getenv(name)
	if v == "" {
		v = def
	}
	sizes, wide, err := parseSizes(v, eps)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return sizes, wide
}

func parseSizes(v string, eps int) (sizes []int, wide []Size, err error) {
	for _, f := range strings.Split(v, ",") {
		ns, es, hasE := strings.Cut(strings.ToLower(strings.TrimSpace(f)), "x")
		n, err := strconv.Atoi(ns)
		e := eps
		if err == nil && hasE {
			e, err = strconv.Atoi(es)
		}
		if err != nil || n <= 0 || e <= 0 {
			return nil, nil, fmt.Errorf("want comma-separated N or NxE (E endpoints per service), positive, e.g. 1000,10000,5000x50")
		}
		if e == eps {
			sizes = append(sizes, n)
		} else {
			wide = append(wide, Size{n, e})
		}
	}
	return sizes, wide, nil
}

func intEnv(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want an integer", name, v)
	}
	return n
}

func durEnv(t *testing.T, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return d
}

// --- unit tests of the measuring helpers (no root needed) ----------------------------

func TestParseMetricsAndHistogram(t *testing.T) {
	text := `# HELP kubeproxy_network_programming_duration_seconds x
# TYPE kubeproxy_network_programming_duration_seconds histogram
kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="0.25"} 2
kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="0.5"} 6
kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="1"} 10
kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="+Inf"} 10
kubeproxy_network_programming_duration_seconds_sum{ip_family="IPv4"} 4
kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"} 10
kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv6",le="0.25"} 100
kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv6",le="0.5"} 100
kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv6",le="1"} 100
kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv6",le="+Inf"} 100
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1.7e+09
nftproxy_sync_kernel_duration_seconds_sum 0.5
nftproxy_sync_kernel_duration_seconds_count 4
odd_label{a="x,y}",b="q\"z"} 3 1700000000
`
	m, err := parseMetrics(text)
	if err != nil {
		t.Fatal(err)
	}
	ms := metricSet(m)
	if v, ok := ms.value("kubeproxy_sync_proxy_rules_last_timestamp_seconds"); !ok || v != 1.7e9 {
		t.Errorf("last timestamp = %v %v", v, ok)
	}
	if v, _ := ms.value("odd_label"); v != 3 {
		t.Errorf("odd_label = %v", v)
	}
	var odd sample
	for _, s := range m {
		if s.Name == "odd_label" {
			odd = s
		}
	}
	if odd.Labels["a"] != "x,y}" || odd.Labels["b"] != `q"z` {
		t.Errorf("labels %q", odd.Labels)
	}
	h := ms.histogram("kubeproxy_network_programming_duration_seconds")
	if h.Count != 10 || h.Sum != 4 || len(h.Bounds) != 4 {
		t.Fatalf("histogram (IPv4 only) %+v", h)
	}
	// 5th of 10 observations: in (0.25, 0.5], 3 of the 4 there → 0.25 + 0.25*3/4
	if q := h.quantile(0.5); math.Abs(q-0.4375) > 1e-9 {
		t.Errorf("p50 = %v, want 0.4375", q)
	}
	if q := h.quantile(0.99); math.Abs(q-(0.5+0.5*3.9/4)) > 1e-9 {
		t.Errorf("p99 = %v", q)
	}
	empty := h.sub(h)
	if !math.IsNaN(empty.quantile(0.5)) || empty.Count != 0 {
		t.Errorf("h-h = %+v", empty)
	}
	k := ms.histogram("nftproxy_sync_kernel_duration_seconds")
	if k.Sum/k.Count != 0.125 {
		t.Errorf("kernel mean %v", k.Sum/k.Count)
	}
}

func TestProcParsers(t *testing.T) {
	stat := "1234 (kube proxy) S 1 1234 1234 0 -1 4194560 5000 0 0 0 250 130 0 0 20 0 12 0 100 0 0"
	if v, err := parseStatCPU(stat); err != nil || math.Abs(v-3.8) > 1e-9 {
		t.Errorf("cpu = %v %v, want 3.8", v, err)
	}
	hwm, rss, err := parseStatusMem("Name:\tx\nVmPeak:\t 9 kB\nVmHWM:\t  51200 kB\nVmRSS:\t  40960 kB\n")
	if err != nil || hwm != 51200 || rss != 40960 {
		t.Errorf("mem = %d %d %v", hwm, rss, err)
	}
	if _, err := cpuSeconds(os.Getpid()); err != nil {
		t.Error(err)
	}
	if h, _, err := memKB(os.Getpid()); err != nil || h <= 0 {
		t.Errorf("own VmHWM %d %v", h, err)
	}
}

func TestCountRuleset(t *testing.T) {
	j := `{"nftables": [{"metainfo": {"json_schema_version": 1}},
 {"table": {"family": "ip", "name": "t", "handle": 1}},
 {"chain": {"family": "ip", "table": "t", "name": "a", "handle": 1}},
 {"chain": {"family": "ip", "table": "t", "name": "b", "handle": 2}},
 {"map": {"family": "ip", "name": "m", "table": "t", "type": "ipv4_addr", "map": "verdict", "elem": [["10.0.0.1", {"jump": {"target": "a"}}], ["10.0.0.2", {"jump": {"target": "b"}}]]}},
 {"set": {"family": "ip", "name": "s", "table": "t", "type": "ipv4_addr", "elem": ["10.0.0.3"]}},
 {"set": {"family": "ip", "name": "e", "table": "t", "type": "ipv4_addr"}},
 {"rule": {"family": "ip", "table": "t", "chain": "a", "handle": 3, "expr": []}}]}`
	f, err := countRuleset([]byte(j))
	if err != nil {
		t.Fatal(err)
	}
	if f.Tables != 1 || f.Chains != 2 || f.Rules != 1 || f.Sets != 3 || f.Elements != 3 {
		t.Errorf("%+v", f)
	}
}

func TestParseSizes(t *testing.T) {
	sizes, wide, err := parseSizes("1000, 10000,5000x50,50000X5,2000x10", 10)
	if err != nil || !slices.Equal(sizes, []int{1000, 10000, 2000}) || !slices.Equal(wide, []Size{{5000, 50}, {50000, 5}}) {
		t.Errorf("%v %v %v", sizes, wide, err)
	}
	for _, bad := range []string{"", "x50", "1000x", "0", "10x0", "abc"} {
		if _, _, err := parseSizes(bad, 10); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestSampleAndPct(t *testing.T) {
	s := sampleIndexes(1000, 5)
	if len(s) != 5 || s[0] != 0 || s[4] != 999 {
		t.Errorf("sample = %v", s)
	}
	if s := sampleIndexes(1, 5); len(s) != 1 || s[0] != 0 {
		t.Errorf("sample(1) = %v", s)
	}
	if p := pct([]float64{4, 1, 3, 2}, 0.5); p != 2.5 {
		t.Errorf("p50 = %v", p)
	}
	if p := pct([]float64{1, 2, 3}, 0.99); math.Abs(p-2.98) > 1e-9 {
		t.Errorf("p99 = %v", p)
	}
}

// The report and the chart render whatever the runs hold, timed-out and skipped runs
// included.
func TestReportRenders(t *testing.T) {
	res := &Results{Host: Host{KubeProxy: "Kubernetes v1.37.0", CPUs: 2, Etcd: "3.7.0"}, Options: Opts{Endpoints: 10, Repeats: 2,
		Burst: &BurstOpts{Services: 10, Gap: 100 * time.Millisecond, Rounds: 2, Idle: 5 * time.Second}}}
	for _, n := range []int{10, 1000} {
		for i, p := range []string{"nftproxy", "kube-proxy-nftables", "kube-proxy-iptables"} {
			f := float64(i + 1)
			r := &Run{Proxy: p, N: n, Endpoints: 10,
				ColdStart:      &ColdStart{AllProgrammed: f * float64(n) / 100, FirstSync: f, InformersSynced: 0.1, Sampled: 2, Answered: 2, BoundSeconds: 600},
				Footprint:      &Footprint{Tables: 2, Chains: n, Rules: n, Elements: n, PerService: 3, ListSeconds: 0.1},
				AddService:     &Latency{Samples: 2, P50: 5 * f, P99: 9 * f, Max: 9 * f, KernelMS: f},
				EndpointChange: &Latency{Samples: 2, P50: 6 * f, P99: 8 * f, Max: 8 * f, KernelMS: f},
				Burst: &Burst{Quiet: &BurstRun{Latency: Latency{Samples: 20, P50: 20 * f, P99: 40 * f, Max: 40 * f}, Syncs: 10, Seconds: 1.1},
					Churn: &BurstRun{Latency: Latency{Samples: 20, P50: 30 * f, P99: 60 * f, Max: 60 * f}, Syncs: 12, Seconds: 1.2, ChurnRate: 50, Written: 200}},
			}
			if n == 1000 && i == 0 {
				r.ColdStart.Informers = &InformerPath{Path: "watch-list", WatchListSeconds: 1.2}
			}
			if n == 1000 && i == 2 {
				r.ColdStart.TimedOut, r.ColdStart.AllProgrammed, r.ColdStart.Answered = true, 0, 1
				r.AddService, r.EndpointChange, r.Footprint = nil, nil, nil
			}
			res.Runs = append(res.Runs, r)
		}
	}
	res.Runs = append(res.Runs, &Run{Proxy: "kube-proxy-iptables", N: 5000, Skipped: "cold start exceeded the bound at a smaller N"})
	res.Ratios = ratios(res.Runs)
	var lower bool
	for _, q := range res.Ratios {
		if q.N == 1000 && q.Upstream == "kube-proxy-iptables" && q.Metric == "cold start: all programmed (s)" {
			lower = strings.Contains(q.Note, "lower bound") && math.Abs(q.Ratio-60) < 1e-9
		}
	}
	if !lower {
		t.Errorf("no lower-bound ratio for the timed-out run: %+v", res.Ratios)
	}
	var burst bool
	for _, q := range res.Ratios {
		if q.N == 10 && q.Upstream == "kube-proxy-nftables" && q.Metric == "burst under churn: Service → connection p50 (ms)" {
			burst = math.Abs(q.Ratio-2) < 1e-9
		}
	}
	if !burst {
		t.Errorf("no burst ratio: %+v", res.Ratios)
	}
	md := res.Markdown()
	for _, s := range []string{"> 600 s (1/2 answered)", ", etcd 3.7.0;", "| nftproxy | 1000 × 10 | watch-list (1.20 s) | 100 ms |", "skipped: cold start exceeded", "| kube-proxy-nftables | 10 × 10 |",
		"| nftproxy | 10 × 10 | under churn (50/s) | 30 ms / 60 ms / 60 ms |"} {
		if !strings.Contains(md, s) {
			t.Errorf("markdown lacks %q:\n%s", s, md)
		}
	}
	b, err := res.Chart()
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil || img.Bounds().Dx() < 1000 {
		t.Fatalf("chart: %v", err)
	}
}
