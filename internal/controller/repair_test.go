package controller

import (
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/nftproxy/nftproxy/internal/metrics"
	"github.com/nftproxy/nftproxy/internal/status"
	"github.com/nftproxy/nftproxy/nft/monitor"
)

// fakeRepairClock is a manual clock; Advance runs the callbacks that fall due, in time
// order, outside its lock.
type fakeRepairClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []fakeTimer
}

type fakeTimer struct {
	at time.Time
	f  func()
}

func (c *fakeRepairClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeRepairClock) AfterFunc(d time.Duration, f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.timers = append(c.timers, fakeTimer{c.now.Add(d), f})
}

// Advance moves the clock to now+d, stopping at every timer on the way.
func (c *fakeRepairClock) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	for {
		sort.SliceStable(c.timers, func(i, j int) bool { return c.timers[i].at.Before(c.timers[j].at) })
		if len(c.timers) == 0 || c.timers[0].at.After(end) {
			break
		}
		t := c.timers[0]
		c.timers = c.timers[1:]
		c.now = t.at
		c.mu.Unlock()
		t.f()
		c.mu.Lock()
	}
	c.now = end
	c.mu.Unlock()
}

// fakeRepairTarget stands for the Proxy: a requested repair is done syncTime later.
type fakeRepairTarget struct {
	clock    *fakeRepairClock
	syncTime time.Duration
	mu       sync.Mutex
	requests []time.Time
	reasons  []string
	onRepair func()
}

func (f *fakeRepairTarget) RequestRepair(reason string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, f.clock.Now())
	f.reasons = append(f.reasons, reason)
	if f.onRepair != nil {
		f.onRepair()
	}
}

func (f *fakeRepairTarget) Status() status.Sync {
	f.mu.Lock()
	defer f.mu.Unlock()
	var s status.Sync
	for _, r := range f.requests {
		if done := r.Add(f.syncTime); !done.After(f.clock.Now()) {
			s.LastSync = done
		}
	}
	return s
}

func (f *fakeRepairTarget) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.requests)
}

// recordingMetrics keeps what a Repairer reports.
type recordingMetrics struct {
	metrics.Nop
	mu       sync.Mutex
	changes  int
	repairs  int
	backoffs []time.Duration
}

func (m *recordingMetrics) ForeignChange(bool) { m.mu.Lock(); m.changes++; m.mu.Unlock() }
func (m *recordingMetrics) Repaired(bool)      { m.mu.Lock(); m.repairs++; m.mu.Unlock() }
func (m *recordingMetrics) RepairBackoff(d time.Duration) {
	m.mu.Lock()
	m.backoffs = append(m.backoffs, d)
	m.mu.Unlock()
}

type repairFixture struct {
	clock  *fakeRepairClock
	target *fakeRepairTarget
	m      *recordingMetrics
	r      *Repairer
	mu     sync.Mutex
	lines  []string
	start  time.Time
}

func newRepairFixture() *repairFixture {
	clk := &fakeRepairClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	f := &repairFixture{clock: clk, target: &fakeRepairTarget{clock: clk, syncTime: 50 * time.Millisecond}, m: &recordingMetrics{}, start: clk.now}
	log := funcr.New(func(_, args string) { f.mu.Lock(); f.lines = append(f.lines, args); f.mu.Unlock() }, funcr.Options{})
	f.r = newRepairer(f.target, RepairBackoff{}, clk, log, f.m)
	return f
}

func (f *repairFixture) change() {
	f.r.Changed(monitor.Change{Reason: "table ip nftproxy: rule added in chain services, by pid 7 (nft)"})
}

// offsets returns the repair request times relative to the start.
func (f *repairFixture) offsets() []time.Duration {
	f.target.mu.Lock()
	defer f.target.mu.Unlock()
	var out []time.Duration
	for _, r := range f.target.requests {
		out = append(out, r.Sub(f.start))
	}
	return out
}

func (f *repairFixture) logLines(substr string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, l := range f.lines {
		if strings.Contains(l, substr) {
			n++
		}
	}
	return n
}

// fight changes the table every period for d.
func (f *repairFixture) fight(period, d time.Duration) {
	for end := f.clock.Now().Add(d); f.clock.Now().Before(end); {
		f.change()
		f.clock.Advance(period)
	}
}

// One-off changes, however many, are each repaired at once when they come a few
// seconds apart (an administrator's successive nft commands, the e2e self-healing test).
func TestRepairOneOffChangesAreImmediate(t *testing.T) {
	f := newRepairFixture()
	for i := range 5 {
		f.clock.Advance(3 * time.Second)
		before := f.target.count()
		f.change()
		if f.target.count() != before+1 {
			t.Fatalf("change %d: no repair requested at once", i)
		}
	}
	if len(f.m.backoffs) != 0 || f.logLines("back off") != 0 {
		t.Errorf("one-off changes backed off: gauge %v, log %v", f.m.backoffs, f.lines)
	}
	if n := f.logLines("repairing"); n != 5 {
		t.Errorf("%d repair log lines, want one per change", n)
	}
}

// A process changing the table every 200 ms for 20 s: repairs at 0, 1, 3, 7 and 15 s
// (each spacing twice the one before), one log line per step, and the metrics follow.
// Without backoff that is 100 repairs (one per change, at --min-sync-period 0) or 20
// (one per second).
func TestRepairFightBacksOff(t *testing.T) {
	f := newRepairFixture()
	f.fight(200*time.Millisecond, 20*time.Second)
	want := []time.Duration{0, time.Second, 3 * time.Second, 7 * time.Second, 15 * time.Second}
	if got := f.offsets(); !slices.Equal(got, want) {
		t.Fatalf("repairs requested at %v, want %v", got, want)
	}
	if got, want := f.m.backoffs, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second}; !slices.Equal(got, want) {
		t.Errorf("backoff gauge %v, want %v", got, want)
	}
	if f.m.changes != 100 || f.m.repairs != 5 {
		t.Errorf("metrics: %d foreign changes, %d repairs; want 100, 5", f.m.changes, f.m.repairs)
	}
	if n := f.logLines("back off"); n != 5 {
		t.Errorf("%d backoff log lines, want 5 (one per step): %v", n, f.lines)
	}
	if n := len(f.lines); n > 6 {
		t.Errorf("%d log lines in a 20s fight, want at most 6", n)
	}
	// The fight stops: the scheduled repair (15 s + 16 s) covers the last changes,
	// then after a quiet minute repairs are immediate again.
	f.clock.Advance(11 * time.Second)
	if got := f.offsets(); len(got) != 6 || got[5] != 31*time.Second {
		t.Fatalf("repairs %v, want a sixth at 31s", got)
	}
	if r := f.target.reasons[5]; !strings.Contains(r, "more changes by other processes") {
		t.Errorf("reason of the covering repair %q does not count the changes", r)
	}
	f.clock.Advance(DefaultRepairQuiet)
	if got := f.m.backoffs[len(f.m.backoffs)-1]; got != 0 {
		t.Errorf("backoff %v after a quiet minute, want 0", got)
	}
	if f.logLines("immediate again") != 1 {
		t.Errorf("the end of the fight was not logged: %v", f.lines)
	}
	before := f.target.count()
	f.change()
	if f.target.count() != before+1 {
		t.Error("a one-off change after the fight was not repaired at once")
	}
}

// The spacing stops doubling at Max, and a process that undoes each repair right
// away (so there is never a quiet minute after a repair) keeps it there.
func TestRepairBackoffIsCapped(t *testing.T) {
	f := newRepairFixture()
	f.target.onRepair = func() { f.clock.AfterFunc(100*time.Millisecond, f.change) }
	f.change()
	f.clock.Advance(time.Hour)
	got := f.m.backoffs
	if last := got[len(got)-1]; last != DefaultRepairBackoffMax {
		t.Fatalf("backoff settled at %v, want %v (steps %v)", last, DefaultRepairBackoffMax, got)
	}
	for _, d := range got {
		if d > DefaultRepairBackoffMax || d == 0 {
			t.Errorf("backoff %v: above the cap, or reset during the fight (steps %v)", d, got)
		}
	}
	// 1+2+4+...+64 s = 127 s to reach the cap, then one repair every 2 minutes
	if n := f.target.count(); n < 30 || n > 38 {
		t.Errorf("%d repairs in an hour of fighting, want 30-38", n)
	}
	// one line per step: the first repair's, then one per change that came after a
	// repair (the last one's repair is still scheduled)
	if n := len(f.lines); n != f.target.count()+1 {
		t.Errorf("%d log lines for %d repairs, want one per repair and one more", n, f.target.count())
	}
}

// A second change while the first repair is still being written (the repair has not
// ended) is a fight too: it is not lost, a repair follows after the initial spacing.
func TestRepairChangeDuringRepair(t *testing.T) {
	f := newRepairFixture()
	f.target.syncTime = 2 * time.Second // a large table
	f.change()
	f.clock.Advance(500 * time.Millisecond)
	f.change()
	if f.target.count() != 1 {
		t.Fatalf("%d repairs requested during the first, want it to wait", f.target.count())
	}
	f.clock.Advance(600 * time.Millisecond)
	if got := f.offsets(); len(got) != 2 || got[1] != time.Second {
		t.Fatalf("repairs at %v, want a second at 1s", got)
	}
}
