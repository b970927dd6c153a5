// Package runner runs the proxy's sync function with bounded frequency: changes are
// batched so that syncs are at least MinInterval apart, a sync happens at least every
// MaxInterval even without changes, and a failed sync is retried after RetryInterval.
package runner

import (
	"fmt"
	"time"

	"k8s.io/utils/clock"
)

// Runner coalesces sync requests. Its zero value is not usable; use New.
type Runner struct {
	fn                        func(periodic bool) error
	min, max, retry           time.Duration
	clock                     clock.Clock
	requests                  chan struct{}
	onPanic                   func(any)
	lastStart, nextUnrequired time.Time
	failures                  int // consecutive failed runs
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

// New returns a Runner for fn. fn's argument is true for a run that nobody requested
// (the periodic resync or a retry), false for one triggered by Request.
func New(fn func(periodic bool) error, minInterval, maxInterval, retryInterval time.Duration, clk clock.Clock) *Runner {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Runner{
		fn: fn, min: minInterval, max: maxInterval, retry: min(retryInterval, maxInterval),
		clock: clk, requests: make(chan struct{}, 1),
	}
}

// OnPanic sets a function called with the value of a recovered panic in fn.
func (r *Runner) OnPanic(f func(any)) { r.onPanic = f }

// Request asks for a sync as soon as MinInterval allows. Requests made before that sync
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
			if earliest := r.lastStart.Add(r.min); due.IsZero() || earliest.Before(due) {
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
		err := r.safeRun(!pending)
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
