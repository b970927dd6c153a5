package runner

import (
	"errors"
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
}

func newHarness(t *testing.T) *harness {
	h := &harness{t: t, runs: make(chan bool, 10), fail: make(chan error, 10), stop: make(chan struct{})}
	h.start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h.clk = clocktesting.NewFakeClock(h.start)
	h.r = New(func(periodic bool) error {
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

func TestRequestsAreBatchedByMinInterval(t *testing.T) {
	h := newHarness(t)
	h.loop()
	h.expectRun(false)
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
