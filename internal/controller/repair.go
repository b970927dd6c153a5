package controller

import (
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/metrics"
	"github.com/nftproxy/nftproxy/internal/pipeline"
	"github.com/nftproxy/nftproxy/internal/status"
	"github.com/nftproxy/nftproxy/nft/monitor"
)

// RequestRepair asks for a sync that rewrites the whole table from scratch, as soon as
// the runner allows. It is safe to call from any goroutine: the dataplane is only ever
// touched by the sync goroutine, which takes the request in takeRepair.
func (p *Proxy) RequestRepair(reason string) {
	p.mu.Lock()
	if p.repairReason == "" {
		p.repairReason = reason
	}
	p.mu.Unlock()
	p.runner.Request()
}

// takeRepair returns the pending repair request's reason and clears it; "" if none.
func (p *Proxy) takeRepair() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.repairReason
	p.repairReason = ""
	return r
}

// Tables are nftproxy's tables, one per family in pipeline.Families: what the monitor watches.
func Tables() []monitor.TableID {
	out := make([]monitor.TableID, 0, len(pipeline.Families))
	for _, fam := range pipeline.Families {
		out = append(out, monitor.TableID{Family: fam, Name: compile.TableName})
	}
	return out
}

// RepairBackoff paces the repairs of foreign changes. A one-off change is repaired at
// once (within --min-sync-period). A fight — another process changing the tables again
// soon after a repair, or while repairs are already spaced out — spaces the repairs:
// Initial after the first repair of the fight, doubling per repair up to Max. The
// spacing is forgotten once no foreign change followed a repair for Quiet.
type RepairBackoff struct {
	Initial time.Duration // default 1s; also how soon after a repair a change means a fight
	Max     time.Duration // default 2m
	Quiet   time.Duration // default 1m
}

// Default repair pacing.
const (
	DefaultRepairBackoffInitial = time.Second
	DefaultRepairBackoffMax     = 2 * time.Minute
	DefaultRepairQuiet          = time.Minute
)

func (b RepairBackoff) withDefaults() RepairBackoff {
	if b.Initial <= 0 {
		b.Initial = DefaultRepairBackoffInitial
	}
	if b.Max < b.Initial {
		b.Max = max(DefaultRepairBackoffMax, b.Initial)
	}
	if b.Quiet <= 0 {
		b.Quiet = DefaultRepairQuiet
	}
	return b
}

// repairTarget is what a Repairer drives: the Proxy.
type repairTarget interface {
	RequestRepair(reason string)
	Status() status.Sync
}

// Repairer turns the nftables monitor's reports (Changed is its callback) into repair
// requests to the Proxy, backing off while another process keeps changing the tables:
// each repair is a rewrite of the whole table, and rewriting 2,000 services every
// --min-sync-period against a process that changes the table every 200 ms costs a
// third of a core and changes nothing. The log says so once per backoff step, with
// the number of changes since the last line; metrics count every foreign change
// (nftproxy_dataplane_foreign_changes_total), every repair
// (nftproxy_dataplane_repairs_total) and show the current spacing
// (nftproxy_dataplane_repair_backoff_seconds, 0 when there is no fight).
type Repairer struct {
	target  repairTarget
	b       RepairBackoff
	clock   repairClock
	log     logr.Logger
	metrics metrics.Recorder

	mu        sync.Mutex
	backoff   time.Duration // spacing between repairs; 0: no fight, repair at once
	requested time.Time     // when the last repair was requested; zero: never
	stepped   bool          // the backoff was raised since the last repair
	pending   bool          // a repair is scheduled (timer seq due)
	lost      bool          // events were lost since the last repair
	reason    string        // the first change since the last repair
	since     int           // foreign changes since the last repair
	unlogged  int           // foreign changes since the last log line
	seq       uint64        // identifies the live quiet timer; a stale one does nothing
}

// repairClock is the Repairer's clock; tests use a fake one.
type repairClock interface {
	Now() time.Time
	AfterFunc(d time.Duration, f func())
}

type realClock struct{}

func (realClock) Now() time.Time                      { return time.Now() }
func (realClock) AfterFunc(d time.Duration, f func()) { time.AfterFunc(d, f) }

// NewRepairer returns the Repairer of p (zero RepairBackoff fields take the defaults).
func NewRepairer(p *Proxy, b RepairBackoff) *Repairer {
	return newRepairer(p, b, realClock{}, p.log, p.cfg.Metrics)
}

func newRepairer(t repairTarget, b RepairBackoff, clk repairClock, log logr.Logger, m metrics.Recorder) *Repairer {
	if m == nil {
		m = metrics.Nop{}
	}
	return &Repairer{target: t, b: b.withDefaults(), clock: clk, log: log, metrics: m}
}

// Changed is the nftables monitor's callback (monitor.Monitor): another process changed
// our tables, or change events were lost. It does not block.
func (r *Repairer) Changed(c monitor.Change) {
	r.metrics.ForeignChange(c.Lost)
	now := r.clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.since++
	r.unlogged++
	r.lost = r.lost || c.Lost
	if r.reason == "" {
		r.reason = c.Reason
	}
	r.seq++ // no quiet timer survives a change
	if r.pending {
		return // the scheduled repair will cover it
	}
	gap := r.sinceRepair(now)
	if (r.backoff > 0 || gap < r.b.Initial) && !r.stepped {
		r.stepped = true
		prev := r.backoff
		r.backoff = min(max(2*r.backoff, r.b.Initial), r.b.Max)
		if r.backoff != prev {
			r.metrics.RepairBackoff(r.backoff)
		}
		r.log.Info("Another process keeps changing nftproxy's nftables tables; repairs back off",
			"changes", r.unlogged, "sinceLastRepair", gap.Round(time.Millisecond), "backoff", r.backoff, "reason", c.Reason, "eventsLost", c.Lost)
		r.unlogged = 0
	}
	due := r.requested.Add(r.backoff)
	if r.backoff == 0 || !due.After(now) {
		if r.backoff == 0 {
			r.log.Info("nftables tables changed by someone else; repairing", "reason", c.Reason, "eventsLost", c.Lost)
			r.unlogged = 0
		}
		r.repair(now)
		return
	}
	r.pending = true
	r.clock.AfterFunc(due.Sub(now), func() { r.fire(due) })
}

// sinceRepair is how long ago the last repair ended: 0 if it has not (yet), a very
// long time if there was none.
func (r *Repairer) sinceRepair(now time.Time) time.Duration {
	if r.requested.IsZero() {
		return 1<<63 - 1
	}
	done := r.target.Status().LastSync
	if done.Before(r.requested) {
		return 0
	}
	return now.Sub(done)
}

// fire runs the repair scheduled for at, whatever changes came since.
func (r *Repairer) fire(at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.pending {
		return
	}
	r.pending = false
	r.repair(at)
}

// repair requests a repair now; r.mu is held.
func (r *Repairer) repair(now time.Time) {
	reason := r.reason
	if r.since > 1 {
		reason = fmt.Sprintf("%s (and %d more changes by other processes)", reason, r.since-1)
	}
	r.metrics.Repaired(r.lost)
	r.requested, r.stepped, r.lost, r.reason, r.since = now, false, false, "", 0
	if r.backoff > 0 {
		r.seq++
		seq := r.seq
		r.clock.AfterFunc(r.b.Quiet, func() { r.calm(seq) })
	}
	r.target.RequestRepair(reason)
}

// calm ends a fight: no foreign change came for Quiet after a repair.
func (r *Repairer) calm(seq uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if seq != r.seq || r.pending || r.backoff == 0 {
		return
	}
	r.log.Info("No more changes to nftproxy's nftables tables by other processes; repairs are immediate again",
		"quietFor", r.b.Quiet, "changesNotLogged", r.unlogged)
	r.backoff, r.unlogged = 0, 0
	r.metrics.RepairBackoff(0)
}
