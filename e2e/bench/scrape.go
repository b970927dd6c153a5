package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// saveHeapProfile writes nftproxy's heap profile, taken after a collection, to path.
func (s *suite) saveHeapProfile(ctx context.Context, path string) error {
	return s.saveProfile(ctx, "heap?gc=1", time.Minute, path)
}

// saveProfile writes the proxy's /debug/pprof/<what> to path.
func (s *suite) saveProfile(ctx context.Context, what string, timeout time.Duration, path string) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+metricsAddr+"/debug/pprof/"+what, nil)
	if err != nil {
		return err
	}
	resp, err := s.metricsClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/debug/pprof/%s: HTTP %d", what, resp.StatusCode)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	s.logf("bench: profile in %s", path)
	return f.Close()
}

// goRuntime fills in the Go runtime's memory figures from a scrape.
func (mem *Memory) goRuntime(m metricSet) {
	mib := func(name string) float64 { v, _ := m.value(name); return v / (1 << 20) }
	mem.HeapAllocMiB = mib("go_memstats_heap_alloc_bytes")
	mem.HeapInuseMiB = mib("go_memstats_heap_inuse_bytes")
	mem.HeapRetainedMiB = mib("go_memstats_heap_idle_bytes") - mib("go_memstats_heap_released_bytes")
	mem.NextGCMiB = mib("go_memstats_next_gc_bytes")
}

// scrape reads the proxy's /metrics. nftproxy serves its per-service counters on
// /metrics/services, which nothing here reads, so a scrape of /metrics neither carries
// them nor makes nftproxy read the kernel's counter sets. The filter of nftproxy_service_
// lines is kept for builds from before that split (two series per service there:
// megabytes at 30k services); it also drops nftproxy_service_ports, which nothing here
// reads either.
func (s *suite) scrape(ctx context.Context) (metricSet, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+metricsAddr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.metricsClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics: HTTP %d", resp.StatusCode)
	}
	var keep strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "nftproxy_service_") || strings.HasPrefix(line, "#") {
			continue
		}
		keep.WriteString(line)
		keep.WriteByte('\n')
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	m, err := parseMetrics(keep.String())
	return metricSet(m), err
}

func (s *suite) footprint(ctx context.Context, n int) (*Footprint, error) {
	lctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	t0 := time.Now()
	out, err := s.c.Exec(lctx, s.c.NodeNS, "nft", "list", "ruleset")
	d := time.Since(t0)
	if err != nil {
		return nil, fmt.Errorf("nft list ruleset: %v: %s", err, truncate(string(out), 300))
	}
	fp, err := listJSON(ctx, s.c)
	if err != nil {
		return nil, err
	}
	fp.ListSeconds = d.Seconds()
	fp.ListBytes = len(out)
	fp.PerService = float64(fp.Chains+fp.Rules+fp.Elements) / float64(n)
	return &fp, nil
}

// settle waits until the proxy has no pending change and its last sync is behind us:
// at least minGap after the last write (both proxies' --min-sync-period is 1 s), then
// until the pending-change gauges are 0.
func (s *suite) settle(ctx context.Context, since time.Time) {
	const minGap = 1100 * time.Millisecond
	if d := time.Until(since.Add(minGap)); d > 0 {
		time.Sleep(d)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		m, err := s.scrape(ctx)
		if err == nil {
			e, _ := m.value("kubeproxy_sync_proxy_rules_endpoint_changes_pending")
			v, _ := m.value("kubeproxy_sync_proxy_rules_service_changes_pending")
			if e == 0 && v == 0 {
				time.Sleep(200 * time.Millisecond)
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// syncDelta waits (bounded) for at least one sync after before and returns the mean of
// the proxy's kernel metric and of its sync duration over the syncs since.
func (s *suite) syncDelta(ctx context.Context, p Proxy, before metricSet) (kernel, sync float64, err error) {
	deadline := time.Now().Add(30 * time.Second)
	hb := before.histogram(p.KernelMetric)
	sb := before.histogram("kubeproxy_sync_proxy_rules_duration_seconds")
	for {
		m, err := s.scrape(ctx)
		if err == nil {
			hk := m.histogram(p.KernelMetric).sub(hb)
			hs := m.histogram("kubeproxy_sync_proxy_rules_duration_seconds").sub(sb)
			if hk.Count > 0 && hs.Count > 0 {
				return hk.Sum / hk.Count, hs.Sum / hs.Count, nil
			}
		}
		if time.Now().After(deadline) {
			return 0, 0, fmt.Errorf("no sync recorded within 30s (%v)", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
