package bench

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"sync"
	"time"

	"github.com/nftproxy/nftproxy/e2e/cluster"
)

type runOpts struct{ footprint, oneChange, expose, burst, dataPath, churn bool }

// runProxy measures one proxy at the current size, then stops it and removes its rules.
// Its error is fatal for the suite (the node could not be cleaned).
func (s *suite) runProxy(ctx context.Context, p Proxy, r *Run, o runOpts) error {
	c := s.c
	n := r.N
	s.logf("bench: === %s at N=%d", p.Name, n)
	logName := fmt.Sprintf("%s-%d", p.Name, n)
	errf := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		r.Errors = append(r.Errors, msg)
		s.logf("bench: %s N=%d: %s", p.Name, n, msg)
	}
	args := p.args(c)
	if s.o.HeapProfiles != "" && p.Mode == "" {
		args = append(args, "--profiling")
	}
	t0 := time.Now()
	proc, cs, err := s.startCold(ctx, p, n, logName, args)
	if err != nil {
		return err
	}
	defer func() {
		if proc.Running() {
			proc.Stop()
		}
	}()
	r.ColdStart = cs
	if cs.TimedOut || !proc.Running() {
		s.failed[p.Name] = true
		if !proc.Running() {
			errf("proxy exited; log tail:\n%s", proc.Tail(20))
		}
	} else {
		if o.footprint {
			if fp, err := s.footprint(ctx, n); err != nil {
				errf("footprint: %v", err)
			} else {
				r.Footprint = fp
			}
		}
		if o.dataPath {
			if dp, err := s.dataPath(ctx); err != nil {
				errf("data path: %v", err)
			} else {
				r.DataPath = dp
			}
		}
		if o.oneChange {
			r.AddService, r.EndpointChange, r.EndpointReplaced = s.oneChange(ctx, p, n, errf)
		}
		if o.expose {
			r.Expose = s.expose(ctx, p, n, errf)
		}
		if o.burst {
			r.Burst = s.bursts(ctx, p, proc, n, errf)
		}
		if o.churn {
			if ch, err := s.churn(ctx, p, proc, n); err != nil {
				errf("churn: %v", err)
			} else {
				r.Churn = ch
			}
		}
		if !proc.Running() {
			errf("proxy exited during the measurements; log tail:\n%s", proc.Tail(20))
		} else if hwm, rss, err := memKB(proc.PID()); err != nil {
			errf("memory: %v", err)
		} else {
			r.Memory = &Memory{PeakRSSMiB: float64(hwm) / 1024, RSSMiB: float64(rss) / 1024}
			if m, err := s.scrape(ctx); err == nil {
				r.Memory.goRuntime(m)
			}
		}
		if s.o.HeapProfiles != "" && p.Mode == "" && proc.Running() {
			if err := s.saveHeapProfile(ctx, filepath.Join(s.o.HeapProfiles, fmt.Sprintf("heap-%s-%d.pb.gz", p.Name, n))); err != nil {
				errf("heap profile: %v", err)
			}
		}
	}
	s.logf("bench: %s N=%d measured in %v", p.Name, n, time.Since(t0).Round(time.Second))
	proc.Stop()
	tc := time.Now()
	residue, err := s.clean(ctx, p, n, errf)
	r.CleanupSeconds, r.Residue = time.Since(tc).Seconds(), residue
	if err != nil || cs.TimedOut || cs.AllProgrammed > coldRepeatLimit.Seconds() {
		return err
	}
	return s.moreColdStarts(ctx, p, r, args, logName, errf)
}

// moreColdStarts makes the proxy's further cold starts at this size (Options.ColdStarts
// in all, each from an empty ruleset, the proxy stopped and cleaned up after), and makes
// r's cold start figures the medians of all of them.
func (s *suite) moreColdStarts(ctx context.Context, p Proxy, r *Run, args []string, logName string, errf func(string, ...any)) error {
	cs, n := r.ColdStart, r.N
	runs := []ColdRun{{cs.InformersSynced, cs.FirstSync, cs.AllProgrammed, cs.Informers.path()}}
	for i := 2; i <= s.o.ColdStarts; i++ {
		proc, more, err := s.startCold(ctx, p, n, fmt.Sprintf("%s-cold%d", logName, i), args)
		if err != nil {
			return err
		}
		proc.Stop()
		if _, err := s.clean(ctx, p, n, errf); err != nil {
			return err
		}
		if more.TimedOut {
			errf("cold start %d timed out", i)
			break
		}
		runs = append(runs, ColdRun{more.InformersSynced, more.FirstSync, more.AllProgrammed, more.Informers.path()})
	}
	if len(runs) > 1 {
		cs.median(runs)
		s.logf("bench: %s N=%d cold start, median of %d: informers %.2fs, first sync %.2fs, all sampled answered %.2fs",
			p.Name, n, len(cs.Runs), cs.InformersSynced, cs.FirstSync, cs.AllProgrammed)
	}
	return nil
}

// startCold starts the proxy once the control plane is idle, measures its cold start
// and logs it; the process is left running.
func (s *suite) startCold(ctx context.Context, p Proxy, n int, logName string, args []string) (*cluster.Process, *ColdStart, error) {
	before, lerr := s.apiserverListing(ctx) // before the idle wait: the scrape costs the API server CPU
	settled := s.controlPlaneIdle(ctx)
	t0 := time.Now()
	proc, err := s.c.StartProcess(s.c.NodeNS, logName, args...)
	if err != nil {
		return nil, nil, err
	}
	cs := s.coldStart(ctx, p, proc, n, t0)
	cs.SettledAfter = settled.Seconds()
	if lerr == nil {
		var after listing
		if after, lerr = s.apiserverListing(ctx); lerr == nil {
			cs.Informers = informerPath(before, after)
		}
	}
	if lerr != nil {
		s.logf("bench: %s N=%d: informer path unknown: %v", p.Name, n, lerr)
	}
	s.logf("bench: %s N=%d cold start (%s, settled after %.1fs, informers by %s): informers %.2fs, first sync %.2fs, all sampled answered %.2fs (%d/%d)%s",
		p.Name, n, logName, cs.SettledAfter, cs.Informers.path(), cs.InformersSynced, cs.FirstSync, cs.AllProgrammed, cs.Answered, cs.Sampled, map[bool]string{true: " TIMED OUT"}[cs.TimedOut])
	return proc, cs, nil
}

// clean runs the proxy's cleanup after it stopped, checks the node's ruleset is empty
// (an error if not: the next proxy cannot be measured) and flushes conntrack.
func (s *suite) clean(ctx context.Context, p Proxy, n int, errf func(string, ...any)) (residue string, err error) {
	c := s.c
	tc := time.Now()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	out, err := c.Exec(cctx, c.NodeNS, p.cleanupArgs(c)...)
	cancel()
	took := time.Since(tc).Seconds()
	if err != nil {
		errf("--cleanup: %v: %s", err, truncate(string(out), 1000))
	}
	residue, err = ensureEmptyRuleset(ctx, c)
	s.logf("bench: %s N=%d --cleanup took %.1fs; left: %q", p.Name, n, took, residue)
	if err != nil {
		return residue, fmt.Errorf("%s N=%d: %w", p.Name, n, err)
	}
	if out, err := c.Exec(ctx, c.NodeNS, "conntrack", "-F"); err != nil {
		s.logf("bench: conntrack -F: %v: %s", err, out)
	}
	return residue, nil
}

// sampleIndexes returns the service indexes probed at size n: the first, the last and evenly
// spread ones between.
func sampleIndexes(n, k int) []int {
	if k < 2 {
		k = 2
	}
	seen := map[int]bool{}
	var out []int
	for j := range k {
		i := int(math.Round(float64(j) * float64(n-1) / float64(k-1)))
		if !seen[i] {
			seen[i] = true
			out = append(out, i)
		}
	}
	return out
}

// The cold start's probes: each sampled service gets an attempt every coldProbeInterval,
// each given coldProbeTimeout (ten in flight per service: 22 services keep 220 of the
// pool's probePoolSize workers busy). So "all programmed" is at most coldProbeInterval
// late. (Until 2026-11-28 each service had one attempt at a time, with a 200 ms timeout
// and 30 ms pauses: up to 230 ms late; then an attempt every 50 ms with a 150 ms
// timeout, which put the figures on a 50 ms grid: a 10k cold start read 0.71 s whether
// the rules landed at 0.67 or at 0.70 s.)
//
// The first sync's time is read from a metric that holds a timestamp, so how often the
// metric is scraped changes only when the loop ends, not the figure: it is scraped every
// coldScrapeInterval, and uncompressed (metricsClient). Until 2026-11-28 it was scraped
// every 20 ms, gzipped: 80 ms of nftproxy's CPU during a 10k cold start went to serving
// those scrapes, on a machine whose two cores the proxy's start keeps busy.
const (
	coldProbeInterval  = 10 * time.Millisecond
	coldProbeTimeout   = 100 * time.Millisecond
	probePoolSize      = 240
	coldScrapeInterval = 250 * time.Millisecond
)

func (s *suite) coldStart(ctx context.Context, p Proxy, proc *cluster.Process, n int, t0 time.Time) *ColdStart {
	cs := &ColdStart{BoundSeconds: s.o.Bound.Seconds()}
	ctx, cancel := context.WithTimeout(ctx, s.o.Bound)
	defer cancel()
	idx := sampleIndexes(n, s.o.Samples)
	cs.Sampled = len(idx)

	var mu sync.Mutex
	var wg sync.WaitGroup
	var last time.Time
	answered := 0
	for _, i := range idx {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// an attempt every coldProbeInterval, several in flight: until the rules are
			// there, an attempt waits for its timeout, and one attempt at a time would
			// see the rules up to a timeout late
			start, err := s.pool.waitAnswer(ctx, s.a.addr(i), func(string) bool { return true }, coldProbeInterval, coldProbeTimeout, s.o.Bound)
			if err != nil {
				return
			}
			mu.Lock()
			answered++
			if start.After(last) {
				last = start
			}
			mu.Unlock()
		}()
	}
	watch := newLogWatch(proc.Log)
	var scraped time.Time
	for ctx.Err() == nil && proc.Running() {
		if cs.InformersSynced == 0 && watch.poll(p.SyncedLog) {
			cs.InformersSynced = time.Since(t0).Seconds()
		}
		if cs.FirstSync == 0 && time.Since(scraped) >= coldScrapeInterval {
			scraped = time.Now()
			if m, err := s.scrape(ctx); err == nil {
				if v, ok := m.value("kubeproxy_sync_proxy_rules_last_timestamp_seconds"); ok && v > 0 {
					cs.FirstSync = v - float64(t0.UnixNano())/1e9
				}
			}
		}
		mu.Lock()
		all := answered == len(idx)
		mu.Unlock()
		if all && cs.FirstSync > 0 && cs.InformersSynced > 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	cs.Answered = answered
	if answered == len(idx) {
		cs.AllProgrammed = last.Sub(t0).Seconds()
	}
	cs.TimedOut = answered < len(idx) || cs.FirstSync == 0
	return cs
}
