package bench

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"path/filepath"
	"slices"
	"sort"
	"time"
)

// oneChangeBudget bounds the one-change repetitions of one proxy at one N (a slow proxy
// gets fewer repetitions).
const oneChangeBudget = 6 * time.Minute

// oneChange measures, Repeats times each, an added service, an EndpointSlice update that
// changes a service's endpoint count (its E endpoints replaced by one) and one that keeps
// it (one of its endpoints replaced by another pod) at size n: from the API write to the
// first connection that sees the change, with the proxy's kernel and sync metrics for
// the syncs that made it.
func (s *suite) oneChange(ctx context.Context, p Proxy, n int, errf func(string, ...any)) (add, change, replaced *Latency) {
	const (
		interval = 5 * time.Millisecond
		attemptT = 100 * time.Millisecond
		bound    = 2 * time.Minute
	)
	var addLat, addKernel, addSync, chLat, chKernel, chSync, rpLat, rpKernel, rpSync []float64
	addFailed, chFailed, rpFailed := 0, 0, 0
	// The added services' slices first (a slice without its service programs nothing),
	// so that each measured write is the Service create.
	for rep := range s.o.Repeats {
		idx := extraBase + rep
		if err := s.a.createSlice(ctx, idx, s.a.endpoints(idx, s.eps)); err != nil {
			errf("add-service %d: slice: %v", rep, err)
		}
	}
	var changed []int
	defer func() {
		// not timed: the next proxy starts from the same state
		for rep := range s.o.Repeats {
			if err := s.a.deleteService(ctx, extraBase+rep); err != nil {
				errf("delete added service: %v", err)
			}
		}
		for _, target := range changed {
			if err := s.a.setEndpoints(ctx, target, s.a.endpoints(target, s.eps)); err != nil {
				errf("endpoint-change: restore: %v", err)
			}
		}
		s.settle(ctx, time.Now())
	}()
	// pick returns an existing service that no repetition has changed yet, spread over
	// [0, n) (-1: none left).
	pick := func(rep, kind int) int {
		t := (rep*max(1, n/s.o.Repeats) + n/(2*s.o.Repeats) + kind*max(1, n/(4*s.o.Repeats))) % n
		for range n {
			if !slices.Contains(changed, t) {
				return t
			}
			t = (t + 1) % n
		}
		return -1
	}
	// measure writes one change and waits for an answer accepted by want, launching
	// burst attempts every interval; it returns whether the write was made.
	measure := func(kind string, rep int, write func() error, addr string, want func(string) bool, burst int, lat, kernel, sync *[]float64, failed *int) {
		before, err := s.scrape(ctx)
		if err != nil {
			errf("scrape: %v", err)
		}
		t0 := time.Now()
		defer s.settle(ctx, t0)
		if err := write(); err != nil {
			errf("%s %d: %v", kind, rep, err)
			*failed++
			return
		}
		seen, err := s.pool.waitAnswerBurst(ctx, addr, want, interval, burst, attemptT, bound)
		if err != nil {
			errf("%s %d: %v", kind, rep, err)
			*failed++
			return
		}
		*lat = append(*lat, ms(seen.Sub(t0)))
		if k, sy, err := s.syncDelta(ctx, p, before); err == nil {
			*kernel, *sync = append(*kernel, k*1000), append(*sync, sy*1000)
		}
	}
	s.settle(ctx, time.Now())
	began := time.Now()
	for rep := range s.o.Repeats {
		if time.Since(began) > oneChangeBudget {
			errf("one change: stopped after %d of %d repetitions (%v budget)", rep, s.o.Repeats, oneChangeBudget)
			break
		}
		idx := extraBase + rep
		measure("add-service", rep, func() error { return s.a.createService(ctx, idx) }, s.a.addr(idx),
			func(string) bool { return true }, 1, &addLat, &addKernel, &addSync, &addFailed)

		// Endpoint count changed: one existing service's slice moves to a pod that is
		// no endpoint of any bulk service (E endpoints become 1); the first answer from
		// that pod is the new behaviour. Each repetition changes another service
		// (restored at the end).
		if target := pick(rep, 0); target >= 0 {
			changed = append(changed, target)
			alt := s.alt[0]
			measure("endpoint-change", rep, func() error { return s.a.setEndpoints(ctx, target, []netip.Addr{alt.IP}) }, s.a.addr(target),
				func(pod string) bool { return pod == alt.Name }, 1, &chLat, &chKernel, &chSync, &chFailed)
		}

		// Endpoint replaced, the count kept: one of another service's E endpoints
		// becomes the other spare pod. A connection reaches it with probability 1/E,
		// so the attempts go in bursts: ceil(E/2), at most 8, every interval (at E = 10
		// about 10 ms between the rules being live and an answer from the pod, on
		// average; at E = 50 about 30 ms).
		if target := pick(rep, 1); target >= 0 {
			changed = append(changed, target)
			alt := s.alt[1]
			eps := s.a.endpoints(target, s.eps)
			eps[rep%len(eps)] = alt.IP
			measure("endpoint-replaced", rep, func() error { return s.a.setEndpoints(ctx, target, eps) }, s.a.addr(target),
				func(pod string) bool { return pod == alt.Name }, min(8, (len(eps)+1)/2), &rpLat, &rpKernel, &rpSync, &rpFailed)
		}
	}
	add = summarize(addLat, addKernel, addSync, addFailed)
	change = summarize(chLat, chKernel, chSync, chFailed)
	replaced = summarize(rpLat, rpKernel, rpSync, rpFailed)
	s.logf("bench: %s N=%d×%d add-service p50 %.1f ms p99 %.1f ms (kernel %.2f ms); endpoint-change (%d → 1) p50 %.1f ms p99 %.1f ms (kernel %.2f ms); endpoint-replaced p50 %.1f ms p99 %.1f ms (kernel p50 %.2f ms, p99 %.2f ms)",
		p.Name, n, s.eps, add.P50, add.P99, add.KernelMS, s.eps, change.P50, change.P99, change.KernelMS, replaced.P50, replaced.P99, replaced.KernelMS, replaced.KernelP99)
	return add, change, replaced
}

// exposeBase is the first index of the services the expose scenario adds.
const exposeBase = extraBase + 3000

// expose measures what a rollout plus `kubectl expose` produces: a new Service and, as
// soon as that write returns, its EndpointSlice (milliseconds apart), from the Service
// write to the first successful connection to its ClusterIP. Each pair is written
// ExposeGap after the previous one and after the proxy has no pending change, so the
// proxy starts each from the same idle state.
func (s *suite) expose(ctx context.Context, p Proxy, n int, errf func(string, ...any)) *Latency {
	const (
		interval = 5 * time.Millisecond
		attemptT = 100 * time.Millisecond
		bound    = 2 * time.Minute
	)
	var lat, kernel, syncMS, syncs, gaps, sliceWrites, afterSlice []float64
	failed := 0
	reps := s.o.ExposeRepeats
	defer func() {
		for rep := range reps {
			if err := s.a.deleteService(ctx, exposeBase+rep); err != nil {
				errf("expose: delete: %v", err)
			}
		}
		s.settle(ctx, time.Now())
	}()
	s.settle(ctx, time.Now())
	if s.o.HeapProfiles != "" && p.Mode == "" {
		// the metrics server ends a response after 60 s (httplimit.Metrics)
		secs := min(int(time.Duration(reps)*s.o.ExposeGap/time.Second)+1, 50)
		path := filepath.Join(s.o.HeapProfiles, fmt.Sprintf("cpu-expose-%s-%d.pb.gz", p.Name, n))
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := s.saveProfile(ctx, fmt.Sprintf("profile?seconds=%d", secs), time.Duration(secs+60)*time.Second, path); err != nil {
				errf("expose: CPU profile: %v", err)
			}
		}()
		defer func() { <-done }()
	}
	last := time.Now()
	syncHist := "kubeproxy_sync_proxy_rules_duration_seconds"
	for rep := range reps {
		if ctx.Err() != nil {
			break
		}
		if d := time.Until(last.Add(s.o.ExposeGap)); d > 0 {
			time.Sleep(d)
		}
		s.settle(ctx, last)
		idx := exposeBase + rep
		before, err := s.scrape(ctx)
		if err != nil {
			errf("expose %d: scrape: %v", rep, err)
		}
		t0 := time.Now()
		last = t0
		if err := s.a.createService(ctx, idx); err != nil {
			errf("expose %d: service: %v", rep, err)
			failed++
			continue
		}
		t1 := time.Now()
		if err := s.a.createSlice(ctx, idx, s.a.endpoints(idx, s.eps)); err != nil {
			errf("expose %d: slice: %v", rep, err)
			failed++
			continue
		}
		t2 := time.Now()
		gaps, sliceWrites = append(gaps, ms(t1.Sub(t0))), append(sliceWrites, ms(t2.Sub(t1)))
		seen, err := s.pool.waitAnswer(ctx, s.a.addr(idx), func(string) bool { return true }, interval, attemptT, bound)
		if err != nil {
			errf("expose %d: %v", rep, err)
			failed++
			continue
		}
		lat, afterSlice = append(lat, ms(seen.Sub(t0))), append(afterSlice, ms(seen.Sub(t2)))
		// The syncs that made it reachable: those finished by now (a later one may
		// still run for a change that came in meanwhile; the bench writes none).
		if after, err := s.scrape(ctx); err == nil && before != nil {
			hs := after.histogram(syncHist).sub(before.histogram(syncHist))
			hk := after.histogram(p.KernelMetric).sub(before.histogram(p.KernelMetric))
			if hs.Count > 0 && hk.Count > 0 {
				syncs = append(syncs, hs.Count)
				syncMS = append(syncMS, 1000*hs.Sum/hs.Count)
				kernel = append(kernel, 1000*hk.Sum/hk.Count)
			}
		}
	}
	l := summarize(lat, kernel, syncMS, failed)
	if len(syncs) > 0 {
		l.Syncs = pct(syncs, 0.5)
	}
	if len(gaps) > 0 {
		l.WriteGapMS, l.SliceWriteMS = pct(gaps, 0.5), pct(sliceWrites, 0.5)
	}
	if len(afterSlice) > 0 {
		l.AfterSliceP50MS, l.AfterSliceP99MS = pct(afterSlice, 0.5), pct(afterSlice, 0.99)
	}
	s.logf("bench: %s N=%d expose (Service, then EndpointSlice %.1f ms later, its write %.1f ms): p50 %.1f ms p99 %.1f ms max %.1f ms over %d (%d failed); after the EndpointSlice write p50 %.1f ms p99 %.1f ms; %.0f syncs p50, sync %.1f ms, kernel %.2f ms",
		p.Name, n, l.WriteGapMS, l.SliceWriteMS, l.P50, l.P99, l.Max, l.Samples, l.Failed, l.AfterSliceP50MS, l.AfterSliceP99MS, l.Syncs, l.SyncMS, l.KernelMS)
	return l
}

func summarize(lat, kernel, sync []float64, failed int) *Latency {
	l := &Latency{Samples: len(lat), Failed: failed}
	if len(lat) > 0 {
		l.P50, l.P99, l.Max = pct(lat, 0.5), pct(lat, 0.99), slices.Max(lat)
	}
	if len(kernel) > 0 {
		l.KernelMS = pct(kernel, 0.5)
		l.KernelP99 = pct(kernel, 0.99)
		l.SyncMS = pct(sync, 0.5)
	}
	return l
}

// pct is the q-quantile of xs (nearest rank, linear between ranks).
func pct(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	sort.Float64s(s)
	pos := q * float64(len(s)-1)
	lo := int(math.Floor(pos))
	hi := int(math.Ceil(pos))
	return s[lo] + (s[hi]-s[lo])*(pos-float64(lo))
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
