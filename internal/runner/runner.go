// Package runner runs the proxy's sync function, paced by what the syncs cost: a
// requested sync starts after a short coalescing delay unless the syncs before it used up
// their share of the time, in which case it waits, never longer than MinInterval after
// the end of the previous sync. A sync happens at least every MaxInterval even without
// changes, and a failed sync is retried after RetryInterval, doubled after each further
// failure. Syncs never overlap.
package runner

import (
	"fmt"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// Pacing defaults (see Runner).
const (
	// DefaultCoalesce is how long a requested sync waits for further changes after the
	// first one it is to carry (a Service, then its EndpointSlice a few milliseconds
	// later: one sync). Never longer than MinInterval.
	DefaultCoalesce = 10 * time.Millisecond
	// DefaultShare is the sync time allowed per MinInterval: a sync of this duration or
	// longer is followed by a pause of a whole MinInterval, a shorter one by the same
	// fraction of it (with the default 1 s, syncs take at most 50 ms a second, about 5 %
	// of the time).
	DefaultShare = 50 * time.Millisecond
	// DefaultSaved is how many MinIntervals of idle time are saved up for a burst: after
	// that long without syncs (10 s by default), DefaultSaved × DefaultShare of syncs
	// (500 ms) run without pauses.
	DefaultSaved = 10
)

// Runner coalesces sync requests. Its zero value is not usable; use New.
//
// The bound is a budget of idle time, as kube-proxy's MinInterval is one of idle time: it
// grows by the time between the end of one sync and the start of the next (never during
// a sync), up to Saved × MinInterval, and a sync of duration d spends d × MinInterval /
// Share of it (d: its duration, or the CPU time used meanwhile if smaller, see
// MeasureCPU), the budget never going below −MinInterval. A requested sync starts once
// the budget is not negative and Coalesce has passed since the first request it carries.
// So:
//
//   - a sync of Share or longer is followed by a pause of MinInterval (end to start, as
//     kube-proxy counts it), a shorter one by the fraction d / Share of MinInterval;
//   - no requested sync waits longer than MinInterval after the end of the previous one,
//     or longer than Coalesce after its first request when the budget allows;
//   - in any window of length T, syncs take at most Saved × Share + (T/MinInterval) ×
//     Share + one sync's duration (requested syncs and retries; the periodic sync comes
//     only after MaxInterval without a sync and spends nothing, nor does the first sync).
//
// MinInterval 0 means no pacing: every request starts a sync as soon as the previous one
// ended.
type Runner struct {
	fn              func(periodic bool) error
	min, max, retry time.Duration
	clock           clock.Clock
	wake            chan struct{}
	onPanic         func(any)

	// Pacing: the coalescing delay, the sync time allowed per MinInterval, the
	// MinIntervals of idle saved up at most.
	coalesce, share time.Duration
	saved           int
	// cpu, if set, is the process's CPU time (see MeasureCPU).
	cpu func() time.Duration

	mu      sync.Mutex
	pending time.Time // first request not yet taken by a sync; zero: none

	// budget is the idle time saved up at lastEnd (at most saved × min, at least −min).
	budget         time.Duration
	ran            bool
	lastEnd        time.Time
	lastStart      time.Time
	nextUnrequired time.Time
	failures       int // consecutive failed runs
}

// backoff is the wait before retrying after r.failures consecutive failures: the retry
// interval, doubled after each further failure, at most the periodic interval.
func (r *Runner) backoff() time.Duration {
	d := r.retry
	for i := 1; i < r.failures && d < r.max; i++ {
		d *= 2
	}
	return min(d, r.max)
}

// New returns a Runner for fn with the default pacing. fn's argument is true for a run
// that nobody requested (the periodic resync or a retry), false for one triggered by
// Request.
func New(fn func(periodic bool) error, minInterval, maxInterval, retryInterval time.Duration, clk clock.Clock) *Runner {
	if clk == nil {
		clk = clock.RealClock{}
	}
	r := &Runner{
		fn: fn, min: minInterval, max: maxInterval, retry: min(retryInterval, maxInterval),
		clock: clk, wake: make(chan struct{}, 1),
		coalesce: DefaultCoalesce, share: DefaultShare, saved: DefaultSaved,
	}
	r.budget = r.capacity()
	return r
}

func (r *Runner) capacity() time.Duration { return time.Duration(r.saved) * r.min }

// cost is what a sync of duration d spends of the budget: d × min / share.
func (r *Runner) cost(d time.Duration) time.Duration {
	if r.share <= 0 {
		return r.min
	}
	return time.Duration(float64(d) * float64(r.min) / float64(r.share))
}

// available is the budget at now: what was left at the end of the last sync plus the
// idle time since, capped.
func (r *Runner) available(now time.Time) time.Duration {
	if !r.ran {
		return r.capacity()
	}
	return min(r.capacity(), r.budget+now.Sub(r.lastEnd))
}

// earliest is when a sync requested first at since may start.
func (r *Runner) earliest(since time.Time) time.Time {
	if !r.ran || r.min <= 0 {
		return since // the first sync, or no pacing: at once
	}
	t := since.Add(min(r.coalesce, r.min))
	if r.budget < 0 {
		if b := r.lastEnd.Add(-r.budget); b.After(t) {
			t = b
		}
	}
	return t
}

// MeasureCPU makes a sync's cost the smaller of its duration and the CPU time the process
// used meanwhile (cpu returns the process's CPU time so far, e.g. ProcessCPU; a negative
// value when it cannot tell, and the duration counts): on a machine whose CPUs are
// busy with other work a sync takes longer without costing more, and is not paced as if
// it did. Call it before Loop.
func (r *Runner) MeasureCPU(cpu func() time.Duration) { r.cpu = cpu }

// OnPanic sets a function called with the value of a recovered panic in fn.
func (r *Runner) OnPanic(f func(any)) { r.onPanic = f }

// Request asks for a sync: after the coalescing delay if the budget allows it, at the
// latest MinInterval after the end of the previous sync. Requests made before that sync
// starts are merged into it.
func (r *Runner) Request() {
	r.mu.Lock()
	if r.pending.IsZero() {
		r.pending = r.clock.Now()
	}
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// pendingSince is the time of the first request not yet taken; zero if none.
func (r *Runner) pendingSince() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pending
}

// take marks the pending requests as carried by the sync starting now and says whether
// there were any.
func (r *Runner) take() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	had := !r.pending.IsZero()
	r.pending = time.Time{}
	return had
}

// Loop runs syncs until stop is closed. The first sync runs at once.
func (r *Runner) Loop(stop <-chan struct{}) {
	r.Request()
	for {
		select { // a wake-up for a request already in pendingSince
		case <-r.wake:
		default:
		}
		since := r.pendingSince()
		due := r.nextUnrequired
		if !since.IsZero() {
			if e := r.earliest(since); due.IsZero() || e.Before(due) {
				due = e
			}
		}
		if wait := due.Sub(r.clock.Now()); wait > 0 {
			t := r.clock.NewTimer(wait)
			select {
			case <-stop:
				t.Stop()
				return
			case <-r.wake:
				t.Stop()
				continue
			case <-t.C():
			}
		}
		select {
		case <-stop:
			return
		default:
		}
		// Every run carries the changes requested so far, a periodic run or a retry too.
		requested := r.take()
		r.lastStart = r.clock.Now()
		r.budget = r.available(r.lastStart)
		first := !r.ran
		var cpu0 time.Duration
		if r.cpu != nil {
			cpu0 = r.cpu()
		}
		err := r.safeRun(!requested)
		r.lastEnd = r.clock.Now()
		r.ran = true
		took := r.lastEnd.Sub(r.lastStart)
		if r.cpu != nil {
			if cpu1 := r.cpu(); cpu0 >= 0 && cpu1 >= 0 {
				took = min(took, max(0, cpu1-cpu0))
			}
		}
		// Every requested run and every retry spends its cost. A periodic run does not:
		// it comes only after MaxInterval without any run, and spending the budget then
		// would make the next change wait behind a sync nobody asked for. Nor does the
		// first (the cold start's full sync, once).
		if periodic := !requested && r.failures == 0; !periodic && !first {
			r.budget = max(-r.min, r.budget-r.cost(took))
		}
		if err != nil {
			r.failures++
			r.nextUnrequired = r.lastStart.Add(r.backoff())
		} else {
			r.failures = 0
			r.nextUnrequired = r.lastStart.Add(r.max)
		}
	}
}

func (r *Runner) safeRun(periodic bool) (err error) {
	defer func() {
		if p := recover(); p != nil {
			if r.onPanic != nil {
				r.onPanic(p)
			}
			err = fmt.Errorf("sync panicked: %v", p)
		}
	}()
	return r.fn(periodic)
}
