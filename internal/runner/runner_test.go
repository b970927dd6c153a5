package runner

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
)

// The tests are deterministic: the runner's goroutine reports everything it does, in
// order, on one channel (a run, from the sync function; a wait, from the clock when it
// makes a timer), and the fake clock moves only while the runner waits on a timer, at
// most to that timer's deadline. "No run before X" is "the runner waits until X", never a
// real-time pause; real time is only the safety net of a broken runner.

// event is one thing the runner did: a run (start time, periodic flag) or a wait on a
// timer (when it began and how long).
type event struct {
	run      bool
	periodic bool
	at       time.Duration // since h.start
	wait     time.Duration
}

func (e event) String() string {
	if e.run {
		return fmt.Sprintf("run(periodic=%v) at %v", e.periodic, e.at)
	}
	return fmt.Sprintf("wait %v at %v", e.wait, e.at)
}

// tracingClock is a fake clock that reports each timer the runner makes: the runner
// makes one just before it waits on it.
type tracingClock struct {
	*clocktesting.FakeClock
	h *harness
}

func (c *tracingClock) NewTimer(d time.Duration) clock.Timer {
	t := c.FakeClock.NewTimer(d)
	c.h.report(event{at: c.Now().Sub(c.h.start), wait: d})
	return t
}

// harness drives a Runner with a tracing fake clock.
type harness struct {
	t      *testing.T
	clk    *tracingClock
	r      *Runner
	events chan event
	fail   chan error
	stop   chan struct{}
	done   chan struct{}
	start  time.Time
	// took is how long each run takes on the fake clock; during is called inside each
	// run, after that time passed (both set before loop).
	took   time.Duration
	during func()
	// deadline is when the timer the runner waits on fires (zero: it does not wait).
	deadline time.Time
	inRun    atomic.Int32
	starts   []time.Duration // start of each run, since h.start
	ends     []time.Duration
}

func newHarness(t *testing.T) *harness {
	h := &harness{t: t, events: make(chan event, 1000), fail: make(chan error, 10),
		stop: make(chan struct{}), done: make(chan struct{})}
	h.start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h.clk = &tracingClock{FakeClock: clocktesting.NewFakeClock(h.start), h: h}
	h.r = New(func(periodic bool) error {
		if h.inRun.Add(1) != 1 {
			t.Error("two syncs at once")
		}
		defer h.inRun.Add(-1)
		h.report(event{run: true, periodic: periodic, at: h.clk.Now().Sub(h.start)})
		if h.took > 0 {
			h.clk.Step(h.took)
		}
		if h.during != nil {
			h.during()
		}
		select {
		case err := <-h.fail:
			if err == errPanic {
				panic("boom")
			}
			return err
		default:
			return nil
		}
	}, time.Second, 30*time.Second, 5*time.Second, h.clk)
	t.Cleanup(func() {
		select {
		case <-h.stop:
		default:
			close(h.stop)
		}
	})
	return h
}

// loop starts the Runner. Failures and the panic handler are set up before it: the
// first run starts at once and must see them.
func (h *harness) loop() {
	go func() {
		defer close(h.done)
		h.r.Loop(h.stop)
	}()
}

var errPanic = errors.New("panic please")

// report records what the runner does, until the test ends.
func (h *harness) report(e event) {
	select {
	case h.events <- e:
	case <-h.stop:
	}
}

func (h *harness) now() time.Duration { return h.clk.Now().Sub(h.start) }

// next is the runner's next action.
func (h *harness) next() event {
	h.t.Helper()
	select {
	case e := <-h.events:
		if e.run {
			h.deadline = time.Time{}
			h.starts = append(h.starts, e.at)
			h.ends = append(h.ends, e.at+h.took)
		} else {
			h.deadline = h.start.Add(e.at + e.wait)
		}
		return e
	case <-time.After(10 * time.Second):
		h.t.Fatalf("the runner did nothing (clock at %v)", h.now())
		return event{}
	}
}

// expectRun: the runner's next action is a run.
func (h *harness) expectRun(periodic bool) {
	h.t.Helper()
	if e := h.next(); !e.run || e.periodic != periodic {
		h.t.Fatalf("%v, want a run with periodic=%v", e, periodic)
	}
}

// expectWait: the runner's next action is to wait d: it runs nothing before.
func (h *harness) expectWait(d time.Duration) {
	h.t.Helper()
	if e := h.next(); e.run || e.wait != d {
		h.t.Fatalf("%v, want a wait of %v", e, d)
	}
}

// advance moves the fake clock by d while the runner waits on its timer, at most to the
// timer's deadline (where the runner then runs or waits again: the caller expects it).
func (h *harness) advance(d time.Duration) {
	h.t.Helper()
	if h.deadline.IsZero() {
		h.t.Fatalf("advance %v at %v: the runner is not waiting", d, h.now())
	}
	if left := h.deadline.Sub(h.clk.Now()); d > left {
		h.t.Fatalf("advance %v at %v: past the runner's timer (%v left)", d, h.now(), left)
	}
	h.clk.Step(d)
}

// fire moves the fake clock to the deadline of the timer the runner waits on.
func (h *harness) fire() {
	h.t.Helper()
	h.advance(h.deadline.Sub(h.clk.Now()))
}

// request asks for a sync while the runner waits; it wakes up and waits again (the
// caller expects how long) or runs.
func (h *harness) request() { h.r.Request() }

// Default pacing: MinInterval 1 s, so a sync spends 20 × its duration of the budget
// (1 s per 50 ms), which holds 10 s.
const coalesce = DefaultCoalesce

func TestFirstRunIsImmediate(t *testing.T) {
	h := newHarness(t)
	h.loop()
	h.expectRun(false)
	h.expectWait(30 * time.Second) // then only the periodic sync is due
}

func TestPeriodicRunAtMaxInterval(t *testing.T) {
	h := newHarness(t)
	h.took = 400 * time.Millisecond
	h.loop()
	h.expectRun(false)
	h.expectWait(29600 * time.Millisecond) // counted from the start of the last sync
	h.fire()
	h.expectRun(true)
	h.expectWait(29600 * time.Millisecond)
}

// TestRequestWaitsOnlyTheCoalescingDelay: with budget, a request runs Coalesce after it,
// and requests made meanwhile are merged into that run.
func TestRequestWaitsOnlyTheCoalescingDelay(t *testing.T) {
	h := newHarness(t)
	h.loop()
	h.expectRun(false)
	h.expectWait(30 * time.Second)
	h.advance(3 * time.Second)
	h.request()
	h.expectWait(coalesce)
	h.advance(3 * time.Millisecond)
	h.request() // the EndpointSlice, 3 ms after its Service: the same sync
	h.expectWait(coalesce - 3*time.Millisecond)
	h.fire()
	h.expectRun(false)
	h.expectWait(30 * time.Second) // two requests, one run
	if got, want := h.starts[1], 3*time.Second+coalesce; got != want {
		t.Fatalf("run at %v, want %v", got, want)
	}
}

// TestBurstIsSyncedWithinCoalescingDelay: ten Services, each with its EndpointSlice 3 ms
// later, 100 ms apart, with syncs of 10 ms (a sync at 10,000 Services): each pair is
// synced Coalesce after its Service, none waits for the budget.
func TestBurstIsSyncedWithinCoalescingDelay(t *testing.T) {
	h := newHarness(t)
	h.took = 10 * time.Millisecond
	h.loop()
	h.expectRun(false)
	h.expectWait(30*time.Second - h.took)
	h.advance(5 * time.Second)
	for i := range 10 {
		at := h.now()
		h.request()
		h.expectWait(coalesce)
		h.advance(3 * time.Millisecond)
		h.request()
		h.expectWait(coalesce - 3*time.Millisecond)
		h.fire()
		h.expectRun(false)
		if got := h.starts[len(h.starts)-1]; got != at+coalesce {
			t.Fatalf("pair %d written at %v synced at %v, want %v", i, at, got, at+coalesce)
		}
		h.expectWait(30*time.Second - h.took)
		h.advance(at + 100*time.Millisecond - h.now())
	}
}

// TestMinIntervalAfterAFullSync: a sync of DefaultShare or longer (400 ms) is followed by
// a pause of MinInterval counted from its end, as kube-proxy counts it, once the saved
// budget is spent; no request waits longer.
func TestMinIntervalAfterAFullSync(t *testing.T) {
	h := newHarness(t)
	h.took = 400 * time.Millisecond
	h.during = h.r.Request // a change during every sync
	h.loop()
	h.expectRun(false) // 0–0.4 s, spends nothing: the first sync
	// the saved 10 s: 0.4 s syncs cost 8 s each, so one more runs after Coalesce
	h.expectWait(coalesce)
	h.fire()
	h.expectRun(false) // 0.41–0.81 s: 2 s left
	h.expectWait(coalesce)
	h.fire()
	h.expectRun(false) // 0.82–1.22 s: at the floor, −1 s
	for range 5 {
		end := h.ends[len(h.ends)-1]
		h.expectWait(time.Second)
		h.advance(999 * time.Millisecond)
		h.request() // a change meanwhile changes nothing
		h.expectWait(time.Millisecond)
		h.fire()
		h.expectRun(false)
		if gap := h.starts[len(h.starts)-1] - end; gap != time.Second {
			t.Fatalf("sync started %v after the previous end, want 1s", gap)
		}
	}
}

// TestSyncStormIsBounded: a change during every sync of 5 ms, for a minute. Once the
// saved budget is spent, each sync is followed by a pause of 20 × its duration (100 ms),
// and in every window syncs take at most the saved 500 ms plus 50 ms per second of the
// window plus one sync.
func TestSyncStormIsBounded(t *testing.T) {
	h := newHarness(t)
	h.took = 5 * time.Millisecond
	h.during = h.r.Request
	h.loop()
	h.expectRun(false)
	for {
		e := h.next()
		if e.at >= time.Minute {
			break
		}
		if e.run {
			continue
		}
		if e.wait > time.Second {
			t.Fatalf("%v: a change waits longer than MinInterval", e)
		}
		h.fire()
	}
	starts, ends := h.starts, h.ends
	last := len(starts) - 1
	for i := last - 20; i < last; i++ {
		if gap := starts[i+1] - ends[i]; gap != 100*time.Millisecond {
			t.Fatalf("run %d starts %v after the previous end, want 100ms (20 × 5 ms)", i+1, gap)
		}
	}
	bound := func(window time.Duration) time.Duration {
		return DefaultSaved*DefaultShare + time.Duration(window.Seconds()*float64(DefaultShare)) + h.took
	}
	for i := range starts {
		busy := time.Duration(0)
		for j := i; j < len(starts); j++ {
			busy += ends[j] - starts[j]
			if window := ends[j] - starts[i]; busy > bound(window) {
				t.Fatalf("syncs took %v in the %v from run %d to %d, more than %v", busy, window, i, j, bound(window))
			}
		}
	}
	if n := len(starts); n < 600 || n > 700 {
		// 10 s saved, 90 ms net per sync: 111 syncs 15 ms apart, then one per 105 ms
		t.Fatalf("%d syncs in a minute of 5 ms syncs, want about 670", n)
	}
}

// TestBudgetRefillsWithIdleTime: idle time refills the budget one to one, up to the
// saved maximum. Syncs of 50 ms cost 1 s each; 2 s saved (no coalescing delay here, to
// keep the sums plain).
func TestBudgetRefillsWithIdleTime(t *testing.T) {
	h := newHarness(t)
	h.took = 50 * time.Millisecond
	h.r.saved = 2
	h.r.coalesce = 0
	h.loop()
	h.expectRun(false) // spends nothing: the first sync
	spend := func(n int) {
		t.Helper()
		for range n {
			h.expectWait(30*time.Second - h.took)
			h.request()
			h.expectRun(false)
		}
	}
	spend(3) // 2 s → 1 s → 0 → −1 s
	h.expectWait(30*time.Second - h.took)
	h.advance(600 * time.Millisecond)
	h.request()
	h.expectWait(400 * time.Millisecond) // until the budget is back at 0
	h.fire()
	h.expectRun(false) // −1 s again
	h.expectWait(30*time.Second - h.took)
	h.advance(5 * time.Second) // refills to 2 s, not 4 s
	h.request()
	h.expectRun(false)
	spend(2)
	h.expectWait(30*time.Second - h.took)
	h.request()
	h.expectWait(time.Second)
}

func TestErrorRetriesAfterRetryInterval(t *testing.T) {
	h := newHarness(t)
	h.fail <- errors.New("kernel said no")
	h.loop()
	h.expectRun(false)
	h.expectWait(5 * time.Second)
	h.fire()
	h.expectRun(true)
	h.expectWait(30 * time.Second) // success: next unrequested run is a full period later
}

func TestPanicIsRecoveredAndRetried(t *testing.T) {
	h := newHarness(t)
	var recovered any
	h.r.OnPanic(func(p any) { recovered = p })
	h.fail <- errPanic
	h.loop()
	h.expectRun(false)
	h.expectWait(5 * time.Second)
	if recovered != "boom" {
		t.Fatalf("recovered %v, want boom", recovered)
	}
	h.fire()
	h.expectRun(true)
}

// TestRetriesBackOff: consecutive failures double the wait (5 s, 10 s, 20 s, then the
// 30 s period at most); a success resets it.
func TestRetriesBackOff(t *testing.T) {
	h := newHarness(t)
	for range 4 {
		h.fail <- errors.New("kernel said no")
	}
	h.loop()
	h.expectRun(false)
	for _, wait := range []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second, 30 * time.Second} {
		h.expectWait(wait)
		h.fire()
		h.expectRun(true)
	}
	h.expectWait(30 * time.Second) // succeeded
	h.fail <- errors.New("again")
	h.fire()
	h.expectRun(true)
	h.expectWait(5 * time.Second) // back to the retry interval
	h.fire()
	h.expectRun(true)
}

// TestRequestDuringBackoffRunsWithBudget: a change during the retry backoff is synced
// after the coalescing delay (its sync is the retry), and a success ends the backoff.
func TestRequestDuringBackoffRunsWithBudget(t *testing.T) {
	h := newHarness(t)
	h.fail <- errors.New("kernel said no")
	h.loop()
	h.expectRun(false)
	h.expectWait(5 * time.Second)
	h.advance(time.Second)
	h.request()
	h.expectWait(coalesce)
	h.fire()
	h.expectRun(false)
	h.expectWait(30 * time.Second)
}

// TestPeriodicRunKeepsBudget: a periodic run spends nothing (a change right after it is
// synced after Coalesce, even after a long sync), while a retry spends like a requested
// sync (a 100 ms sync costs 2 s: the change after it waits MinInterval).
func TestPeriodicRunKeepsBudget(t *testing.T) {
	h := newHarness(t)
	h.took = 100 * time.Millisecond
	h.r.saved = 1
	h.loop()
	h.expectRun(false)
	h.expectWait(30*time.Second - h.took)
	h.fire()
	h.expectRun(true) // periodic
	h.expectWait(30*time.Second - h.took)
	h.request()
	h.expectWait(coalesce)
	h.fire()
	h.expectRun(false) // spends 2 s of the 1 s saved: −1 s
	h.expectWait(30*time.Second - h.took)
	h.request()
	h.expectWait(time.Second)
}

func TestRetrySpendsBudget(t *testing.T) {
	h := newHarness(t)
	h.took = 100 * time.Millisecond
	h.r.saved = 1
	h.fail <- errors.New("kernel said no")
	h.loop()
	h.expectRun(false) // the first sync spends nothing
	h.expectWait(5*time.Second - h.took)
	h.fire()
	h.expectRun(true) // the retry spends 2 s: −1 s
	h.expectWait(30*time.Second - h.took)
	h.request()
	h.expectWait(time.Second)
}

// TestZeroMinIntervalNeverWaits: --min-sync-period=0 runs every request at once.
func TestZeroMinIntervalNeverWaits(t *testing.T) {
	h := newHarness(t)
	h.r.min = 0
	h.took = time.Second
	h.during = h.r.Request
	h.loop()
	h.expectRun(false)
	for range 5 {
		h.expectRun(false)
	}
	if h.starts[5] != 5*time.Second {
		t.Fatalf("starts %v, want one a second back to back", h.starts)
	}
}

// TestStopEndsTheLoop: closing stop ends Loop while it waits, and after a run in
// progress without starting another.
func TestStopEndsTheLoop(t *testing.T) {
	h := newHarness(t)
	h.loop()
	h.expectRun(false)
	h.expectWait(30 * time.Second)
	close(h.stop)
	h.expectDone()

	h = newHarness(t)
	h.during = func() { h.r.Request(); close(h.stop) }
	h.loop()
	h.expectRun(false)
	h.expectDone()
	for {
		select {
		case e := <-h.events:
			if e.run {
				t.Fatalf("%v after stop", e)
			}
		default:
			return
		}
	}
}

func (h *harness) expectDone() {
	h.t.Helper()
	select {
	case <-h.done:
	case <-time.After(10 * time.Second):
		h.t.Fatal("Loop did not return after stop")
	}
}

// TestCostIsCPUTimeWhenSmaller: with MeasureCPU, a sync of 100 ms that used 5 ms of CPU
// (the machine busy with other work) costs 5 ms: a pause of 100 ms, not the whole period;
// one that used more CPU than its duration (two cores) costs its duration.
func TestCostIsCPUTimeWhenSmaller(t *testing.T) {
	h := newHarness(t)
	h.took = 100 * time.Millisecond
	h.r.saved = 0 // every sync pays its pause at once
	var cpu atomic.Int64
	per := atomic.Int64{}
	per.Store(int64(5 * time.Millisecond))
	h.during = func() { cpu.Add(per.Load()) }
	h.r.MeasureCPU(func() time.Duration { return time.Duration(cpu.Load()) })
	h.loop()
	h.expectRun(false) // the first: spends nothing
	h.expectWait(30*time.Second - h.took)
	h.request()
	h.expectWait(coalesce)
	h.fire()
	h.expectRun(false) // 5 ms of CPU: 100 ms of pause
	h.expectWait(30*time.Second - h.took)
	h.request()
	h.expectWait(100 * time.Millisecond)
	per.Store(int64(40 * time.Millisecond))
	h.took = 20 * time.Millisecond // read by the next run, which the clock's timer orders after this
	h.fire()
	h.expectRun(false) // 40 ms of CPU in 20 ms: costs 20 ms, a pause of 400 ms
	h.expectWait(30*time.Second - h.took)
	h.request()
	h.expectWait(400 * time.Millisecond)
}

func TestProcessCPU(t *testing.T) {
	a := ProcessCPU()
	for x := 0; ProcessCPU() == a; x++ { // spin until the kernel's accounting moves
		_ = x * x
	}
	if b := ProcessCPU(); a < 0 || b <= a {
		t.Fatalf("ProcessCPU went from %v to %v", a, b)
	}
}
