// Package runner runs the proxy's sync function with bounded frequency: a requested sync
// runs at once if the budget allows it (a burst of Burst syncs after an idle period,
// otherwise one per MinInterval counted from the end of the previous sync to the start
// of the next), a sync happens at least every MaxInterval even without changes, and a
// failed sync is retried after RetryInterval, doubled after each further failure.
package runner

import (
	"fmt"
	"time"

	"k8s.io/utils/clock"
)

// DefaultBurst is how many requested syncs may run back to back after an idle period
// of DefaultBurst × MinInterval. Two covers the common pair of a new Service and, a few
// milliseconds later, its EndpointSlice (a rollout plus `kubectl expose`): the first
// sync programs the Service, the second its endpoints, without the second waiting for
// MinInterval.
const DefaultBurst = 2

// Runner coalesces sync requests. Its zero value is not usable; use New.
//
// The bound is a budget of idle time: it grows by the time between the end of one sync
// and the start of the next (never during a sync), up to Burst × MinInterval, and every
// sync spends MinInterval of it. A requested sync starts as soon as the budget holds
// MinInterval. So under a steady stream of requests syncs start MinInterval after the
// previous one ended (end to start, as kube-proxy counts), after an idle period of
// Burst × MinInterval up to Burst requested syncs run back to back, and in any window
// of length T at most Burst + T/MinInterval requested syncs and retries start (plus the
// periodic syncs, which come only after MaxInterval without a sync).
type Runner struct {
	fn              func(periodic bool) error
	min, max, retry time.Duration
	burst           int
	clock           clock.Clock
	requests        chan struct{}
	onPanic         func(any)
	// budget is the idle time saved up at lastEnd (at most burst × min).
	budget         time.Duration
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

// New returns a Runner for fn with a burst of DefaultBurst. fn's argument is true for a
// run that nobody requested (the periodic resync or a retry), false for one triggered by
// Request.
func New(fn func(periodic bool) error, minInterval, maxInterval, retryInterval time.Duration, clk clock.Clock) *Runner {
	if clk == nil {
		clk = clock.RealClock{}
	}
	r := &Runner{
		fn: fn, min: minInterval, max: maxInterval, retry: min(retryInterval, maxInterval),
		clock: clk, requests: make(chan struct{}, 1),
	}
	r.SetBurst(DefaultBurst)
	return r
}

// SetBurst sets how many requested syncs may run back to back after an idle period
// (at least 1; 1 is a plain MinInterval between the end of a sync and the next start).
// Call it before Loop.
func (r *Runner) SetBurst(n int) {
	r.burst = max(n, 1)
	r.budget = r.capacity()
}

func (r *Runner) capacity() time.Duration { return time.Duration(r.burst) * r.min }

// available is the budget at now: what was saved at the end of the last sync plus the
// idle time since, capped.
func (r *Runner) available(now time.Time) time.Duration {
	if r.lastEnd.IsZero() {
		return r.capacity()
	}
	return min(r.capacity(), r.budget+now.Sub(r.lastEnd))
}

// earliest is when a requested sync may start: once the budget holds MinInterval.
func (r *Runner) earliest() time.Time {
	if r.lastEnd.IsZero() || r.budget >= r.min {
		return r.lastEnd
	}
	return r.lastEnd.Add(r.min - r.budget)
}

// OnPanic sets a function called with the value of a recovered panic in fn.
func (r *Runner) OnPanic(f func(any)) { r.onPanic = f }

// Request asks for a sync as soon as the budget allows. Requests made before that sync
// starts are merged into it.
func (r *Runner) Request() {
	select {
	case r.requests <- struct{}{}:
	default:
	}
}

// Loop runs syncs until stop is closed. The first sync runs at once.
func (r *Runner) Loop(stop <-chan struct{}) {
	pending := true
	for {
		due := r.nextUnrequired
		if pending {
			if earliest := r.earliest(); due.IsZero() || earliest.Before(due) {
				due = earliest
			}
		}
		if wait := due.Sub(r.clock.Now()); wait > 0 {
			t := r.clock.NewTimer(wait)
			select {
			case <-stop:
				t.Stop()
				return
			case <-r.requests:
				t.Stop()
				pending = true
				continue
			case <-t.C():
			}
		}
		select {
		case <-stop:
			return
		case <-r.requests: // folded into this run
		default:
		}
		r.lastStart = r.clock.Now()
		// Every requested run and every retry spends MinInterval of the budget. A periodic
		// run does not: it comes only after MaxInterval without any run, and spending the
		// budget then made the next change's second sync (a new Service's EndpointSlice,
		// a few milliseconds after the Service) wait MinInterval.
		if periodic := !pending && r.failures == 0; periodic {
			r.budget = r.available(r.lastStart)
		} else {
			r.budget = max(0, r.available(r.lastStart)-r.min)
		}
		err := r.safeRun(!pending)
		r.lastEnd = r.clock.Now()
		pending = false
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
