package runner

import (
	"errors"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// harness drives a Runner with a fake clock and records each run.
type harness struct {
	t     *testing.T
	clk   *clocktesting.FakeClock
	r     *Runner
	runs  chan bool // periodic flag of each run
	fail  chan error
	stop  chan struct{}
	start time.Time
	// took is how long each run takes on the fake clock; during is called inside
	// each run (both set before loop).
	took   time.Duration
	during func()
	mu     sync.Mutex
	starts []time.Duration // start of each run, since h.start
}

func newHarness(t *testing.T) *harness {
	h := &harness{t: t, runs: make(chan bool, 10), fail: make(chan error, 10), stop: make(chan struct{})}
	h.start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h.clk = clocktesting.NewFakeClock(h.start)
	h.r = New(func(periodic bool) error {
		h.mu.Lock()
		h.starts = append(h.starts, h.clk.Now().Sub(h.start))
		h.mu.Unlock()
		if h.took > 0 {
			h.clk.Step(h.took)
		}
		if h.during != nil {
			h.during()
		}
		h.runs <- periodic
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
	t.Cleanup(func() { close(h.stop) })
	return h
}

// loop starts the Runner. Failures and the panic handler are set up before it: the
// first run starts at once and must see them.
func (h *harness) loop() { go h.r.Loop(h.stop) }

var errPanic = errors.New("panic please")

// expectRun waits for a run (real time is only a safety net: the fake clock decides).
func (h *harness) expectRun(periodic bool) {
	h.t.Helper()
	select {
	case p := <-h.runs:
		if p != periodic {
			h.t.Fatalf("run periodic=%v, want %v", p, periodic)
		}
	case <-time.After(2 * time.Second):
		h.t.Fatalf("no run at %v", h.clk.Now().Sub(h.start))
	}
}

func (h *harness) expectNoRun() {
	h.t.Helper()
	select {
	case <-h.runs:
		h.t.Fatalf("unexpected run at %v", h.clk.Now().Sub(h.start))
	case <-time.After(50 * time.Millisecond):
	}
}

// advance moves the fake clock once the runner waits on its timer.
func (h *harness) advance(d time.Duration) {
	h.t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for !h.clk.HasWaiters() {
		if time.Now().After(deadline) {
			h.t.Fatal("runner is not waiting")
		}
		time.Sleep(time.Millisecond)
	}
	h.clk.Step(d)
}

func TestFirstRunIsImmediate(t *testing.T) {
	h := newHarness(t)
	h.loop()
	h.expectRun(false)
}

// TestRequestsAreBatchedByMinInterval: once the burst is spent, requests wait for
// MinInterval after the last sync and are merged into one run.
func TestRequestsAreBatchedByMinInterval(t *testing.T) {
	h := newHarness(t)
	h.loop()
	h.expectRun(false)
	h.r.Request()
	h.expectRun(false) // the second of the burst
	h.r.Request()
	h.r.Request()
	h.r.Request()
	h.expectNoRun()
	h.advance(999 * time.Millisecond)
	h.expectNoRun()
	h.advance(time.Millisecond)
	h.expectRun(false)
	h.expectNoRun() // three requests, one run
}

func TestRequestAfterMinIntervalRunsAtOnce(t *testing.T) {
	h := newHarness(t)
	h.loop()
	h.expectRun(false)
	h.advance(3 * time.Second)
	h.r.Request()
	h.expectRun(false)
}

func TestPeriodicRunAtMaxInterval(t *testing.T) {
	h := newHarness(t)
	h.loop()
	h.expectRun(false)
	h.advance(29 * time.Second)
	h.expectNoRun()
	h.advance(time.Second)
	h.expectRun(true)
}

func TestErrorRetriesAfterRetryInterval(t *testing.T) {
	h := newHarness(t)
	h.fail <- errors.New("kernel said no")
	h.loop()
	h.expectRun(false)
	h.advance(4 * time.Second)
	h.expectNoRun()
	h.advance(time.Second)
	h.expectRun(true)
	// success: next unrequested run is a full period later
	h.advance(29 * time.Second)
	h.expectNoRun()
}

func TestPanicIsRecoveredAndRetried(t *testing.T) {
	h := newHarness(t)
	var recovered any
	h.r.OnPanic(func(p any) { recovered = p })
	h.fail <- errPanic
	h.loop()
	h.expectRun(false)
	h.advance(5 * time.Second)
	h.expectRun(true)
	if recovered != "boom" {
		t.Fatalf("recovered %v, want boom", recovered)
	}
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
	for _, wait := range []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second} {
		h.advance(wait - time.Second)
		h.expectNoRun()
		h.advance(time.Second)
		h.expectRun(true)
	}
	h.advance(29 * time.Second) // capped at the periodic interval
	h.expectNoRun()
	h.advance(time.Second)
	h.expectRun(true) // succeeds
	h.fail <- errors.New("again")
	h.advance(30 * time.Second)
	h.expectRun(true)
	h.advance(4 * time.Second) // back to the retry interval
	h.expectNoRun()
	h.advance(time.Second)
	h.expectRun(true)
}

// exhaust spends the burst left after the first run (one more requested run).
func (h *harness) exhaust() {
	h.t.Helper()
	h.r.Request()
	h.expectRun(false)
}

func (h *harness) startTimes() []time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]time.Duration(nil), h.starts...)
}

// TestBurstAfterIdle: after an idle period of Burst × MinInterval, Burst requested syncs
// run back to back (a new Service, then its EndpointSlice); the next one waits.
func TestBurstAfterIdle(t *testing.T) {
	h := newHarness(t)
	h.loop()
	h.expectRun(false)
	h.exhaust()
	h.r.Request()
	h.expectNoRun()
	h.advance(time.Second)
	h.expectRun(false)

	h.advance(2 * time.Second) // idle: the budget is full again
	h.r.Request()
	h.expectRun(false)
	h.r.Request()
	h.expectRun(false) // at once, no MinInterval wait
	h.r.Request()
	h.expectNoRun()
	h.advance(999 * time.Millisecond)
	h.expectNoRun()
	h.advance(time.Millisecond)
	h.expectRun(false)
	if got := h.startTimes(); got[3] != 3*time.Second || got[4] != 3*time.Second || got[5] != 4*time.Second {
		t.Fatalf("starts %v, want the burst at 3s, 3s and then 4s", got)
	}
}

// TestIdleRefillsPerMinInterval: idle time refills the budget at one sync per
// MinInterval: 1.5 s of idle buys one sync at once and brings the next 0.5 s closer.
func TestIdleRefillsPerMinInterval(t *testing.T) {
	h := newHarness(t)
	h.loop()
	h.expectRun(false)
	h.exhaust()
	h.advance(1500 * time.Millisecond)
	h.r.Request()
	h.expectRun(false)
	h.r.Request()
	h.expectNoRun()
	h.advance(499 * time.Millisecond)
	h.expectNoRun()
	h.advance(time.Millisecond)
	h.expectRun(false)
}

// TestMinIntervalCountsFromSyncEnd: with syncs of 400 ms, the next requested sync starts
// MinInterval after the previous one ended (1.8 s), not after it started (1.4 s).
func TestMinIntervalCountsFromSyncEnd(t *testing.T) {
	h := newHarness(t)
	h.took = 400 * time.Millisecond
	h.loop()
	h.expectRun(false) // 0 – 0.4 s
	h.exhaust()        // 0.4 – 0.8 s
	h.r.Request()
	h.advance(599 * time.Millisecond) // 1.399 s
	h.expectNoRun()
	h.advance(time.Millisecond) // 1.4 s: one MinInterval after the start
	h.expectNoRun()
	h.advance(399 * time.Millisecond)
	h.expectNoRun()
	h.advance(time.Millisecond) // 1.8 s: one MinInterval after the end
	h.expectRun(false)
	if got := h.startTimes(); got[2] != 1800*time.Millisecond {
		t.Fatalf("starts %v, want the third at 1.8s", got)
	}
}

// TestSteadyStreamIsBounded: a change arrives during every sync (100 ms each). After
// the burst, syncs start exactly MinInterval after the previous end, and over the run no
// window of length T holds more than Burst + T/MinInterval starts.
func TestSteadyStreamIsBounded(t *testing.T) {
	h := newHarness(t)
	h.took = 100 * time.Millisecond
	h.during = h.r.Request
	h.loop()
	h.expectRun(false)
	h.expectRun(false) // the burst: at once after the first
	const steady = 12
	for range steady {
		h.advance(999 * time.Millisecond)
		h.expectNoRun()
		h.advance(time.Millisecond)
		h.expectRun(false)
	}
	starts := h.startTimes()
	if len(starts) != steady+2 {
		t.Fatalf("%d runs, want %d", len(starts), steady+2)
	}
	if starts[1] != 100*time.Millisecond {
		t.Fatalf("second run at %v, want 100ms (burst)", starts[1])
	}
	for i := 2; i < len(starts); i++ {
		if gap := starts[i] - (starts[i-1] + h.took); gap != time.Second {
			t.Fatalf("run %d starts %v after the previous end, want 1s (starts %v)", i, gap, starts)
		}
	}
	for i := range starts {
		for j := i; j < len(starts); j++ {
			window := starts[j] - starts[i]
			if n := j - i + 1; float64(n) > float64(DefaultBurst)+window.Seconds()/time.Second.Seconds() {
				t.Fatalf("%d starts within %v (starts %v)", n, window, starts)
			}
		}
	}
}

// TestPeriodicRunKeepsBudget: an unrequested (periodic) run comes only after the periodic
// interval without a run and spends nothing, so the pair of syncs a new Service and its
// EndpointSlice need right after it still runs back to back; the budget still bounds
// the requested runs after that.
func TestPeriodicRunKeepsBudget(t *testing.T) {
	h := newHarness(t)
	h.loop()
	h.expectRun(false)
	h.exhaust()
	h.advance(30 * time.Second)
	h.expectRun(true) // the periodic run, from a full budget
	h.r.Request()
	h.expectRun(false) // the burst is whole
	h.r.Request()
	h.expectRun(false)
	h.r.Request()
	h.expectNoRun() // and then spent
	h.advance(time.Second)
	h.expectRun(false)
}

// TestRetrySpendsBudget: a retry after a failure is a sync like a requested one and
// counts against the bound (unlike a periodic run, after which two requests would run).
func TestRetrySpendsBudget(t *testing.T) {
	h := newHarness(t)
	h.fail <- errors.New("kernel said no")
	h.loop()
	h.expectRun(false) // fails
	h.advance(5 * time.Second)
	h.expectRun(true) // the retry, from a full budget, spends a second of it
	h.r.Request()
	h.expectRun(false) // the last second
	h.r.Request()
	h.expectNoRun()
	h.advance(time.Second)
	h.expectRun(false)
}

// TestZeroMinIntervalNeverWaits: --min-sync-period=0 runs every request at once.
func TestZeroMinIntervalNeverWaits(t *testing.T) {
	h := newHarness(t)
	h.r.min = 0
	h.r.SetBurst(DefaultBurst)
	h.loop()
	h.expectRun(false)
	for range 5 {
		h.r.Request()
		h.expectRun(false)
	}
}
