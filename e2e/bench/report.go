package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
)

func numCPU() int { return runtime.NumCPU() }

// repoRoot is the repository root (this file is e2e/bench/report.go).
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(filepath.Dir(file)))
}

// jsonUnmarshalLast decodes the last non-empty line of out.
func jsonUnmarshalLast(out []byte, v any) error {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return json.Unmarshal([]byte(lines[len(lines)-1]), v)
}

func notes() []string {
	return []string{
		"All three proxies run alone in the same node network namespace of the same local cluster, one after the other, with their default sync periods (1 s minimum, 30 s periodic) and API client settings.",
		"Cold start: seconds from starting the process; 'all programmed' is the start of the last sampled ClusterIP's first answered TCP connection (the first and last created service and evenly spread ones); 'first sync' is kubeproxy_sync_proxy_rules_last_timestamp_seconds; 'informers' is the log line (nftproxy: \"Informer caches synced\"; kube-proxy: the service and endpoint-slice \"Caches are synced\"). Each figure is the median of options.cold_starts cold starts from an empty ruleset (a proxy whose cold start took over a minute is started once at that size); the runs are in results.json.",
		"One change: API write to the first connection (attempts every 5 ms, 100 ms timeout each, from a pod) that sees the change: an answer from the new service, from the pod that became the slice's only endpoint (endpoint count changed: E endpoints → 1), or from the pod that replaced one of the E endpoints (endpoint replaced, the count kept: a connection reaches it with probability 1/E, so min(8, ⌈E/2⌉) attempts start every 5 ms, which adds about 10 ms at E = 10 and 30 ms at E = 50 on average). Kernel: nftproxy_sync_kernel_duration_seconds for nftproxy (the netlink transaction), kubeproxy_sync_proxy_rules_duration_seconds (the whole sync) for kube-proxy, mean per sync over the syncs of the change.",
		"Churn: network programming quantiles come from the kubeproxy_network_programming_duration_seconds histogram delta (bucket interpolation; kube-proxy's buckets are 0.25 s, 0.5 s, then every second). kube-proxy observes once per changed EndpointSlice from its last-change-trigger-time annotation; nftproxy observes once per sync from the oldest change its informer saw, so the packet-measured latency (one of four probe services moved to another pod once a second, answers watched every 5 ms) is the comparable number.",
		"Data path: a one-endpoint service; loadclient in a pod opens, reads one line and resets TCP connections for a fixed time; the pod-IP run is the same endpoint without the service.",
		"Footprint: `nft -j list ruleset` of the node (kube-proxy iptables mode through iptables-nft); objects per service = (chains + rules + set/map elements) / N.",
		"The machine may be shared: compare the proxies within one run, not across runs.",
	}
}

// ratios computes upstream / nftproxy for the main metrics.
func ratios(runs []*Run) []Ratio {
	find := func(proxy string, z Size) *Run {
		for _, r := range runs {
			if r.Proxy == proxy && r.N == z.N && r.Endpoints == z.Endpoints && r.Skipped == "" {
				return r
			}
		}
		return nil
	}
	var out []Ratio
	var ns []Size
	for _, r := range runs {
		if z := (Size{r.N, r.Endpoints}); !slices.Contains(ns, z) {
			ns = append(ns, z)
		}
	}
	type metric struct {
		name string
		get  func(*Run) (float64, bool)
		note string
	}
	ms := []metric{
		{"cold start: all programmed (s)", func(r *Run) (float64, bool) {
			if r.ColdStart == nil || r.ColdStart.TimedOut {
				return 0, false
			}
			return r.ColdStart.AllProgrammed, true
		}, ""},
		{"cold start: first sync (s)", func(r *Run) (float64, bool) {
			if r.ColdStart == nil || r.ColdStart.FirstSync <= 0 {
				return 0, false
			}
			return r.ColdStart.FirstSync, true
		}, ""},
		{"add service p50 (ms)", func(r *Run) (float64, bool) { return latP50(r.AddService) }, ""},
		{"endpoint change p50 (ms)", func(r *Run) (float64, bool) { return latP50(r.EndpointChange) }, "E endpoints → 1: the count changes"},
		{"endpoint replaced p50 (ms)", func(r *Run) (float64, bool) { return latP50(r.EndpointReplaced) }, "one of E endpoints replaced, the count kept"},
		{"new Service + EndpointSlice p50 (ms)", func(r *Run) (float64, bool) { return latP50(r.Expose) }, ""},
		{"new Service + EndpointSlice p99 (ms)", func(r *Run) (float64, bool) {
			if r.Expose == nil || r.Expose.Samples == 0 {
				return 0, false
			}
			return r.Expose.P99, true
		}, ""},
		{"burst: Service → connection p50 (ms)", burstP50(true), "quiet"},
		{"burst under churn: Service → connection p50 (ms)", burstP50(false), ""},
		{"churn packets p50 (ms)", func(r *Run) (float64, bool) {
			if r.Churn == nil || r.Churn.PacketSamples == 0 {
				return 0, false
			}
			return r.Churn.PacketP50, true
		}, ""},
		{"churn CPU (s)", func(r *Run) (float64, bool) {
			if r.Churn == nil {
				return 0, false
			}
			return r.Churn.CPUSeconds, true
		}, ""},
		{"peak RSS (MiB)", func(r *Run) (float64, bool) {
			if r.Memory == nil {
				return 0, false
			}
			return r.Memory.PeakRSSMiB, true
		}, "VmHWM before the proxy is stopped: after the cold start, the one-change tests and, at the churn N, the churn"},
		{"ClusterIP connections/s", func(r *Run) (float64, bool) {
			if r.DataPath == nil || r.DataPath.ClusterIP.OK == 0 {
				return 0, false
			}
			return r.DataPath.ClusterIP.PerSecond, true
		}, "higher is better: a ratio below 1 means fewer connections per second than nftproxy"},
		{"ClusterIP connect p99 (ms)", func(r *Run) (float64, bool) {
			if r.DataPath == nil || r.DataPath.ClusterIP.OK == 0 {
				return 0, false
			}
			return r.DataPath.ClusterIP.P99Millis, true
		}, ""},
		{"objects per service", func(r *Run) (float64, bool) {
			if r.Footprint == nil {
				return 0, false
			}
			return r.Footprint.PerService, true
		}, ""},
		{"nft list ruleset (s)", func(r *Run) (float64, bool) {
			if r.Footprint == nil {
				return 0, false
			}
			return r.Footprint.ListSeconds, true
		}, ""},
	}
	for _, z := range ns {
		n := z.N
		base := find("nftproxy", z)
		if base == nil {
			continue
		}
		for _, up := range []string{"kube-proxy-nftables", "kube-proxy-iptables"} {
			u := find(up, z)
			for _, m := range ms {
				bv, ok := m.get(base)
				if !ok || bv <= 0 {
					continue
				}
				if u == nil {
					// timed out or skipped: a lower bound on the ratio of cold start
					if m.name == "cold start: all programmed (s)" {
						for _, r := range runs {
							if r.Proxy == up && r.N == n && r.Endpoints == z.Endpoints && (r.Skipped != "" || (r.ColdStart != nil && r.ColdStart.TimedOut)) {
								bound := r.ColdStart
								if bound != nil {
									out = append(out, Ratio{Metric: m.name, N: n, Endpoints: z.Endpoints, Upstream: up, Ratio: bound.BoundSeconds / bv, Note: "upstream did not finish: ratio is a lower bound"})
								}
							}
						}
					}
					continue
				}
				uv, ok := m.get(u)
				if !ok {
					if m.name == "cold start: all programmed (s)" && u.ColdStart != nil && u.ColdStart.TimedOut {
						out = append(out, Ratio{Metric: m.name, N: n, Endpoints: z.Endpoints, Upstream: up, Ratio: u.ColdStart.BoundSeconds / bv, Note: "upstream did not finish within the bound: ratio is a lower bound"})
					}
					continue
				}
				out = append(out, Ratio{Metric: m.name, N: n, Endpoints: z.Endpoints, Upstream: up, Ratio: uv / bv, Note: m.note})
			}
		}
	}
	return out
}

func latP50(l *Latency) (float64, bool) {
	if l == nil || l.Samples == 0 {
		return 0, false
	}
	return l.P50, true
}

// Write writes results.json, results.md and chart.png into dir.
func (r *Results) Write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(r.Markdown()), 0o644); err != nil {
		return err
	}
	png, err := r.Chart()
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "chart.png"), png, 0o644)
}

func secs(v float64) string {
	switch {
	case v <= 0:
		return "–"
	case v < 1:
		return fmt.Sprintf("%.0f ms", v*1000)
	case v < 10:
		return fmt.Sprintf("%.2f s", v)
	case v < 100:
		return fmt.Sprintf("%.1f s", v)
	default:
		return fmt.Sprintf("%.0f s", v)
	}
}

func millis(v float64) string {
	switch {
	case v <= 0:
		return "–"
	case v < 10:
		return fmt.Sprintf("%.1f ms", v)
	case v < 10000:
		return fmt.Sprintf("%.0f ms", v)
	default:
		return fmt.Sprintf("%.1f s", v/1000)
	}
}

// Markdown renders the results as tables.
func (r *Results) Markdown() string {
	var b bytes.Buffer
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# Side by side: %s and kube-proxy %s\n\n", orDefault(r.Host.Nftproxy, "nftproxy"), strings.TrimPrefix(r.Host.KubeProxy, "Kubernetes "))
	w("Generated by `make bench` (e2e/bench, `TestSideBySide`) on %s; do not edit. ", r.Started.Format("2006-01-02 15:04 MST"))
	w("Machine: %d CPUs, kernel %s, %s, %s, etcd %s; nftproxy %s (`--version`: %s), kube-proxy `--version`: %s. The run took %.0f min",
		r.Host.CPUs, r.Host.Kernel, r.Host.Nft, r.Host.Iptables, orDefault(r.Host.Etcd, "?"), r.Host.Commit, orDefault(r.Host.Nftproxy, "?"), r.Host.KubeProxy, r.Seconds/60)
	if r.Host.Load != "" {
		w("; %s", r.Host.Load)
	}
	if len(r.Options.Scenarios) > 0 {
		w("; only %s after each cold start", strings.Join(r.Options.Scenarios, ", "))
	}
	w(".\n\n")
	w("![cold start and one-change latency](chart.png)\n\n")

	w("## Cold start\n\nN services × E endpoints each in the API, the proxy started alone on the node. Seconds from the process start. ")
	w("Informers' listing: how the proxy's informers filled their caches, from kube-apiserver's metrics around the cold start ")
	w("(watch-list: `sendInitialEvents=true` streams, `apiserver_watch_list_duration_seconds`, with the API server's time from the requests to the end of their initial events; list: `LIST` requests).\n\n")
	w("| proxy | N | informers' listing | informers synced | first sync done | all sampled ClusterIPs answer | cleanup |\n|---|---:|---|---:|---:|---:|---:|\n")
	for _, run := range r.Runs {
		if run.Skipped != "" {
			w("| %s | %s | | skipped: %s | | | |\n", run.Proxy, nLabel(run), run.Skipped)
			continue
		}
		cs := run.ColdStart
		if cs == nil {
			continue
		}
		all := secs(cs.AllProgrammed)
		if cs.TimedOut {
			all = fmt.Sprintf("> %s (%d/%d answered)", secs(cs.BoundSeconds), cs.Answered, cs.Sampled)
		}
		w("| %s | %s | %s | %s | %s | %s | %s |\n", run.Proxy, nLabel(run), cs.Informers.cell(), secs(cs.InformersSynced), secs(cs.FirstSync), all, secs(run.CleanupSeconds))
	}

	w("\n## One change at scale\n\nAPI write → first TCP connection that sees it (p50 / p99 / max over %d repetitions). Endpoint count changed: a service's E endpoints replaced by one other pod; endpoint replaced: one of its E endpoints replaced by another pod, the count kept. Kernel (p50 / p99 over the changes, each the mean per sync of the syncs until the answer): nftproxy's netlink transaction; kube-proxy's whole sync (its only sync metric). Sync: `kubeproxy_sync_proxy_rules_duration_seconds` of both, p50.\n\n", r.Options.Repeats)
	w("| proxy | N | change | write → connection p50 / p99 / max | kernel p50 / p99 | sync |\n|---|---:|---|---:|---:|---:|\n")
	for _, run := range r.Runs {
		for _, c := range []struct {
			name string
			l    *Latency
		}{{"add service", run.AddService}, {"endpoint count changed", run.EndpointChange}, {"endpoint replaced", run.EndpointReplaced}} {
			if c.l == nil {
				continue
			}
			w("| %s | %s | %s | %s | %s / %s | %s |\n", run.Proxy, nLabel(run), c.name, latCell(c.l), millis(c.l.KernelMS), millis(c.l.KernelP99), millis(c.l.SyncMS))
		}
	}

	if r.Options.Expose > 0 {
		w("\n## New Service + EndpointSlice\n\nWhat a rollout plus `kubectl expose` produces: a new Service, then its EndpointSlice as soon as that write returns (write gap p50 in the table), %.0f s after the previous pair and with no change pending; Service write → first successful TCP connection to its ClusterIP (p50 / p99 / max over %d pairs). After the slice: from the return of the EndpointSlice write (whose own latency is in the next column) to that connection (p50 / p99), the part after the API server has taken both objects. Syncs: how many syncs ran until then (p50); sync and kernel: mean per sync.\n\n", r.Options.ExposeGapS, r.Options.Expose)
		w("| proxy | N | Service → connection p50 / p99 / max | write gap | slice write | after the slice p50 / p99 | syncs | sync | kernel |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, run := range r.Runs {
			if e := run.Expose; e != nil {
				w("| %s | %s | %s | %s | %s | %s / %s | %.0f | %s | %s |\n", run.Proxy, nLabel(run), latCell(e), millis(e.WriteGapMS), millis(e.SliceWriteMS),
					millis(e.AfterSliceP50MS), millis(e.AfterSliceP99MS), e.Syncs, millis(e.SyncMS), millis(e.KernelMS))
			}
		}
	}

	r.burstMarkdown(w)

	w("\n## Churn\n\n")
	w("| proxy | N | writes (rate) | programming p50 / p99 (histogram, obs.) | packets p50 / p99 (samples) | syncs | CPU | peak RSS |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, run := range r.Runs {
		c := run.Churn
		if c == nil {
			continue
		}
		w("| %s | %s | %d in %.0f s (%d/s) | %s / %s (%.0f) | %s / %s (%d, %d failed) | %.0f | %.1f s (%.0f%% of a core) | %.0f MiB |\n",
			run.Proxy, nLabel(run), c.Written, c.Seconds, c.Rate, secs(c.ProgP50), secs(c.ProgP99), c.ProgCount,
			millis(c.PacketP50), millis(c.PacketP99), c.PacketSamples, c.PacketFailed, c.SyncsInWindow, c.CPUSeconds, c.CPUPercent, c.PeakRSSMiB)
	}

	w("\n## Memory\n\nResident memory of the proxy just before it is stopped (after the cold start, the one-change tests and, at the churn N, the churn): the peak since it started (`VmHWM`) and the current (`VmRSS`).\n\n")
	w("Go heap, from the proxy's go_memstats metrics at the same moment: live objects (`heap_alloc`), the spans that hold them (`heap_inuse`), free heap still resident (`heap_idle - heap_released`) and the next collection's goal (`next_gc`).\n\n")
	w("| proxy | N | peak RSS | RSS | live | in use | free, resident | next GC |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, run := range r.Runs {
		if m := run.Memory; m != nil {
			w("| %s | %s | %.0f MiB | %.0f MiB | %.0f MiB | %.0f MiB | %.0f MiB | %.0f MiB |\n", run.Proxy, nLabel(run), m.PeakRSSMiB, m.RSSMiB,
				m.HeapAllocMiB, m.HeapInuseMiB, m.HeapRetainedMiB, m.NextGCMiB)
		}
	}

	w("\n## Data path\n\nNew TCP connections to a one-endpoint service's ClusterIP and, for the physical limit, to the same endpoint's pod IP (loadclient in a pod).\n\n")
	w("| proxy | N | ClusterIP conn/s | p50 | p99 | pod IP conn/s | p50 | p99 |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, run := range r.Runs {
		d := run.DataPath
		if d == nil {
			continue
		}
		w("| %s | %s | %.0f | %.3f ms | %.3f ms | %.0f | %.3f ms | %.3f ms |\n", run.Proxy, nLabel(run),
			d.ClusterIP.PerSecond, d.ClusterIP.P50Millis, d.ClusterIP.P99Millis, d.PodIP.PerSecond, d.PodIP.P50Millis, d.PodIP.P99Millis)
	}

	w("\n## Kernel footprint\n\n")
	w("| proxy | N | tables | chains | rules | sets+maps | elements | objects / service | `nft list ruleset` | output |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, run := range r.Runs {
		f := run.Footprint
		if f == nil {
			continue
		}
		w("| %s | %s | %d | %d | %d | %d | %d | %.1f | %s | %.1f MB |\n", run.Proxy, nLabel(run), f.Tables, f.Chains, f.Rules, f.Sets, f.Elements, f.PerService, secs(f.ListSeconds), float64(f.ListBytes)/1e6)
	}

	if len(r.Ratios) > 0 {
		w("\n## Ratios (upstream / nftproxy)\n\n| metric | N | kube-proxy nftables | kube-proxy iptables |\n|---|---:|---:|---:|\n")
		type key struct {
			m string
			n Size
		}
		var keys []key
		vals := map[key]map[string]Ratio{}
		for _, q := range r.Ratios {
			k := key{q.Metric, Size{q.N, q.Endpoints}}
			if vals[k] == nil {
				vals[k] = map[string]Ratio{}
				keys = append(keys, k)
			}
			vals[k][q.Upstream] = q
		}
		cell := func(q Ratio, ok bool) string {
			if !ok {
				return "–"
			}
			s := fmt.Sprintf("%.2f×", q.Ratio)
			if strings.Contains(q.Note, "lower bound") {
				s = "> " + s
			}
			return s
		}
		for _, k := range keys {
			a, okA := vals[k]["kube-proxy-nftables"]
			b, okB := vals[k]["kube-proxy-iptables"]
			w("| %s | %s | %s | %s |\n", k.m, nLabel(&Run{N: k.n.N, Endpoints: k.n.Endpoints}), cell(a, okA), cell(b, okB))
		}
		w("\nConnections per second: higher is better, so there a ratio below 1 favours nftproxy.\n")
	}

	var errs []string
	for _, run := range r.Runs {
		for _, e := range run.Errors {
			errs = append(errs, fmt.Sprintf("%s N=%d: %s", run.Proxy, run.N, strings.SplitN(e, "\n", 2)[0]))
		}
		if run.Residue != "" {
			errs = append(errs, fmt.Sprintf("%s N=%d: --cleanup left %s (flushed by the suite)", run.Proxy, run.N, run.Residue))
		}
	}
	if len(errs) > 0 {
		w("\n## Errors and residue\n\n")
		for _, e := range errs {
			w("- %s\n", e)
		}
	}
	w("\n## Method\n\n")
	for _, n := range r.Notes {
		w("- %s\n", n)
	}
	w("- Writing the API objects:")
	for _, p := range r.Populate {
		w(" %d objects in %.0f s (N=%d, %d endpoints);", p.Objects, p.Seconds, p.N, p.Endpoints)
	}
	w("\n")
	return b.String()
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func nLabel(r *Run) string {
	if r.Endpoints != 0 {
		return fmt.Sprintf("%d × %d", r.N, r.Endpoints)
	}
	return fmt.Sprint(r.N)
}

func latCell(l *Latency) string {
	if l == nil || l.Samples == 0 {
		if l != nil && l.Failed > 0 {
			return fmt.Sprintf("all %d failed", l.Failed)
		}
		return "–"
	}
	s := fmt.Sprintf("%s / %s / %s", millis(l.P50), millis(l.P99), millis(l.Max))
	if l.Failed > 0 {
		s += fmt.Sprintf(" (%d failed)", l.Failed)
	}
	return s
}
