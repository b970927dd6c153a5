package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nftproxy/nftproxy/e2e/cluster"
)

// BurstOpts configure the burst scenario: Rounds bursts of Services new Services, each
// followed by its EndpointSlice as soon as that write returns, the Services Gap apart
// (a Helm install, a `kubectl apply -f` of several Services), after Idle without writes;
// then as many bursts while endpoint churn runs at Options.ChurnRate writes/s.
type BurstOpts struct {
	Services int           `json:"services"`
	Gap      time.Duration `json:"gap_ns"`
	Rounds   int           `json:"rounds"`
	Idle     time.Duration `json:"idle_ns"`
}

// Burst is the burst scenario's result for one proxy at one N.
type Burst struct {
	Quiet *BurstRun `json:"quiet,omitempty"` // nothing else written
	Churn *BurstRun `json:"churn,omitempty"` // while endpoint churn runs
}

// BurstRun summarizes the bursts of one kind: each Service write → the first connection
// to its ClusterIP (Latency: p50 / p99 / max over every Service of every round; SyncMS,
// KernelMS: mean per sync over the rounds' windows), and what the proxy spent meanwhile.
type BurstRun struct {
	Latency
	Syncs      float64 `json:"syncs"`          // syncs in the rounds' windows (all rounds)
	Seconds    float64 `json:"window_seconds"` // the rounds' windows: first write → last answer
	CPUSeconds float64 `json:"cpu_seconds"`    // the proxy's CPU in those windows
	CPUPercent float64 `json:"cpu_percent"`    // of one core
	ChurnRate  int     `json:"churn_rate_per_s,omitempty"`
	Written    int     `json:"churn_written,omitempty"`
}

// burstBase is the first index of the services the burst scenario adds.
const burstBase = extraBase + 4000

// burstWarmup: how long the churn runs before a burst, so that the burst meets a proxy in
// the churn's steady state.
const burstWarmup = 3 * time.Second

// bursts measures the burst scenario: quiet, then under churn.
func (s *suite) bursts(ctx context.Context, p Proxy, proc *cluster.Process, n int, errf func(string, ...any)) *Burst {
	o := s.o.Burst
	b := &Burst{}
	next := burstBase
	var made []int
	defer func() {
		for _, idx := range made {
			if err := s.a.deleteService(ctx, idx); err != nil {
				errf("burst: delete: %v", err)
			}
		}
		s.settle(ctx, time.Now())
	}()
	run := func(churn bool) *BurstRun {
		br := &BurstRun{}
		var lat, afterSlice, kernel, syncMS []float64
		for round := range o.Rounds {
			if ctx.Err() != nil {
				break
			}
			s.settle(ctx, time.Now())
			time.Sleep(o.Idle)
			var stopChurn func() int
			if churn {
				stopChurn = s.backgroundChurn(ctx, n, errf)
				br.ChurnRate = s.o.ChurnRate
				time.Sleep(burstWarmup)
			}
			idx := make([]int, o.Services)
			for i := range idx {
				idx[i] = next
				next++
			}
			made = append(made, idx...)
			before, err := s.scrape(ctx)
			if err != nil {
				errf("burst %d: scrape: %v", round, err)
			}
			cpu0, _ := cpuSeconds(proc.PID())
			t0 := time.Now()
			res := s.oneBurst(ctx, idx, o.Gap, errf)
			window := time.Since(t0)
			cpu1, _ := cpuSeconds(proc.PID())
			after, afterErr := s.scrape(ctx)
			if stopChurn != nil {
				br.Written += stopChurn() // and its restoring writes, outside the window
			}
			for _, r := range res {
				if r.err != nil {
					errf("burst %d: %v", round, r.err)
					br.Failed++
					continue
				}
				lat, afterSlice = append(lat, r.lat), append(afterSlice, r.afterSlice)
			}
			br.Seconds += window.Seconds()
			br.CPUSeconds += cpu1 - cpu0
			if afterErr == nil && before != nil {
				sh := "kubeproxy_sync_proxy_rules_duration_seconds"
				hs := after.histogram(sh).sub(before.histogram(sh))
				hk := after.histogram(p.KernelMetric).sub(before.histogram(p.KernelMetric))
				br.Syncs += hs.Count
				if hs.Count > 0 && hk.Count > 0 {
					syncMS, kernel = append(syncMS, 1000*hs.Sum/hs.Count), append(kernel, 1000*hk.Sum/hk.Count)
				}
			}
		}
		l := summarize(lat, kernel, syncMS, br.Failed)
		br.Latency = *l
		if len(afterSlice) > 0 {
			br.AfterSliceP50MS, br.AfterSliceP99MS = pct(afterSlice, 0.5), pct(afterSlice, 0.99)
		}
		if br.Seconds > 0 {
			br.CPUPercent = 100 * br.CPUSeconds / br.Seconds
		}
		what := "quiet"
		if churn {
			what = fmt.Sprintf("under churn (%d writes/s, %d written)", br.ChurnRate, br.Written)
		}
		s.logf("bench: %s N=%d burst %s: %d Services %v apart, %d rounds: Service → connection p50 %.1f ms p99 %.1f ms max %.1f ms (%d, %d failed); after the slice p50 %.1f ms; %.0f syncs of %.1f ms in %.1f s, cpu %.2f s (%.0f%%)",
			p.Name, n, what, o.Services, o.Gap, o.Rounds, br.P50, br.P99, br.Max, br.Samples, br.Failed, br.AfterSliceP50MS, br.Syncs, br.SyncMS, br.Seconds, br.CPUSeconds, br.CPUPercent)
		return br
	}
	b.Quiet = run(false)
	if s.o.ChurnRate > 0 && n > 0 {
		b.Churn = run(true)
	}
	return b
}

type burstResult struct {
	lat, afterSlice float64 // ms
	err             error
}

// oneBurst writes the Services idx, gap apart, each followed by its EndpointSlice, and
// waits for the first connection to each ClusterIP (from the Service write).
func (s *suite) oneBurst(ctx context.Context, idx []int, gap time.Duration, errf func(string, ...any)) []burstResult {
	const (
		interval = 5 * time.Millisecond
		attemptT = 100 * time.Millisecond
		bound    = 2 * time.Minute
	)
	res := make([]burstResult, len(idx))
	var wg sync.WaitGroup
	start := time.Now()
	for i, id := range idx {
		if d := time.Until(start.Add(time.Duration(i) * gap)); d > 0 {
			time.Sleep(d)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &res[i]
			t0 := time.Now()
			if err := s.a.createService(ctx, id); err != nil {
				r.err = fmt.Errorf("service %d: %w", i, err)
				return
			}
			if err := s.a.createSlice(ctx, id, s.a.endpoints(id, s.eps)); err != nil {
				r.err = fmt.Errorf("slice %d: %w", i, err)
				return
			}
			t2 := time.Now()
			seen, err := s.pool.waitAnswer(ctx, s.a.addr(id), func(string) bool { return true }, interval, attemptT, bound)
			if err != nil {
				r.err = fmt.Errorf("service %d: %w", i, err)
				return
			}
			r.lat, r.afterSlice = ms(seen.Sub(t0)), ms(seen.Sub(t2))
		}()
	}
	wg.Wait()
	return res
}

// backgroundChurn writes Options.ChurnRate endpoint changes per second to the bulk
// services (one endpoint removed, the next time added back) until the returned function
// is called; that restores every churned service's endpoints and returns the number of
// writes made.
func (s *suite) backgroundChurn(ctx context.Context, n int, errf func(string, ...any)) func() int {
	ctx, cancel := context.WithCancel(ctx)
	writes := make(chan func(), 64)
	var mu sync.Mutex
	written, failed := 0, 0
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for w := range writes {
				w()
			}
		}()
	}
	rotation := map[int]int{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(writes)
		tick := time.NewTicker(time.Second / time.Duration(s.o.ChurnRate))
		defer tick.Stop()
		const stride = 7919 // consecutive writes hit services far apart
		for k := 0; ; k++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			i := (k * stride) % n
			rotation[i]++
			eps := s.a.endpoints(i, s.eps)
			if rotation[i]%2 == 1 {
				eps = eps[:len(eps)-1]
			}
			select {
			case writes <- func() {
				err := s.a.setEndpoints(ctx, i, eps)
				mu.Lock()
				defer mu.Unlock()
				if err == nil {
					written++
				} else if ctx.Err() == nil {
					failed++
				}
			}:
			case <-ctx.Done():
				return
			}
		}
	}()
	return func() int {
		cancel()
		<-done
		wg.Wait()
		if failed > 0 {
			errf("burst churn: %d writes failed", failed)
		}
		var idx []int
		for i, r := range rotation {
			if r%2 == 1 {
				idx = append(idx, i)
			}
		}
		slices.Sort(idx)
		if err := parallel(context.WithoutCancel(ctx), 0, len(idx), 8, func(ctx context.Context, j int) error {
			return retry(ctx, func() error { return s.a.setEndpoints(ctx, idx[j], s.a.endpoints(idx[j], s.eps)) })
		}); err != nil {
			errf("burst churn: restore: %v", err)
		}
		return written
	}
}

// burstMarkdown renders the burst scenario's table.
func (r *Results) burstMarkdown(w func(string, ...any)) {
	o := r.Options.Burst
	if o == nil {
		return
	}
	w("\n## Bursts\n\n%d new Services %.0f ms apart, each followed by its EndpointSlice as soon as its write returns, after %.0f s without writes (quiet) or while endpoint churn runs at the churn rate (after %.0f s of it); %d rounds of each. Each Service write → the first TCP connection to its ClusterIP (p50 / p99 / max over all of them); after the slice: from the return of the EndpointSlice write. Syncs, sync (mean) and the proxy's CPU: over the rounds' windows, first write to last answer.\n\n",
		o.Services, float64(o.Gap)/1e6, o.Idle.Seconds(), burstWarmup.Seconds(), o.Rounds)
	w("| proxy | N | burst | Service → connection p50 / p99 / max | after the slice p50 / p99 | syncs | sync | CPU |\n|---|---:|---|---:|---:|---:|---:|---:|\n")
	for _, run := range r.Runs {
		if run.Burst == nil {
			continue
		}
		for _, c := range []struct {
			name string
			b    *BurstRun
		}{{"quiet", run.Burst.Quiet}, {"under churn", run.Burst.Churn}} {
			if c.b == nil {
				continue
			}
			name := c.name
			if c.b.ChurnRate > 0 {
				name = fmt.Sprintf("%s (%d/s)", name, c.b.ChurnRate)
			}
			w("| %s | %s | %s | %s | %s / %s | %.0f in %.1f s | %s | %.2f s (%.0f%%) |\n", run.Proxy, nLabel(run), name, latCell(&c.b.Latency),
				millis(c.b.AfterSliceP50MS), millis(c.b.AfterSliceP99MS), c.b.Syncs, c.b.Seconds, millis(c.b.SyncMS), c.b.CPUSeconds, c.b.CPUPercent)
		}
	}
}

// burstP50 is the ratios' getter for one kind of burst.
func burstP50(quiet bool) func(*Run) (float64, bool) {
	return func(r *Run) (float64, bool) {
		if r.Burst == nil {
			return 0, false
		}
		b := r.Burst.Churn
		if quiet {
			b = r.Burst.Quiet
		}
		if b == nil || b.Samples == 0 {
			return 0, false
		}
		return b.P50, true
	}
}
