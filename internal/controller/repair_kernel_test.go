package controller

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/nftproxy/nftproxy/internal/metrics"
	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/nft/kernel"
	"github.com/nftproxy/nftproxy/nft/monitor"
)

// countingApplier is a real Applier that counts the full rewrites asked of it.
type countingApplier struct {
	*kernel.Applier
	resyncs atomic.Int64
}

func (a *countingApplier) Resync() { a.resyncs.Add(1); a.Applier.Resync() }

// TestKernelRepairFight runs the proxy (--min-sync-period 10ms), the nftables monitor
// and the Repairer against a real kernel in a throwaway namespace, with another
// netlink socket adding a rule to our table every 200 ms for 20 s. Every change used
// to be repaired by a rewrite of the whole table: about 100 rewrites in those 20 s
// (one per change). With the backoff (1 s doubling, capped at 4 s here) it is 7.
// After the fight the table is restored by the next scheduled repair, and once the
// quiet period (2 s here) has passed a one-off change is repaired within a second.
func TestKernelRepairFight(t *testing.T) {
	ns := testnetns.New(t)
	applier := &countingApplier{Applier: kernel.New(kernel.WithNetNS(ns.FD))}
	_, p := startProxyWith(t, applier, service("a", "10.96.0.1"), slice("a", "a-1", "10.244.1.2"))
	list := func() string { out, _ := ns.Run(t, "", "nft", "list", "table", "ip", "nftproxy"); return out }
	waitFor(t, "first sync in the kernel", func() bool { return strings.Contains(list(), "10.244.1.2 . 8080") })
	want := list()

	var logMu sync.Mutex
	var lines []string
	log := funcr.New(func(_, args string) { logMu.Lock(); lines = append(lines, args); logMu.Unlock() }, funcr.Options{})
	rec := metrics.New(metrics.Options{NoRuntimeMetrics: true})
	repairs := newRepairer(p, RepairBackoff{Initial: time.Second, Max: 4 * time.Second, Quiet: 2 * time.Second}, realClock{}, log, rec)
	mon := monitor.New(Tables(), repairs.Changed, monitor.NetNS(ns.FD), monitor.IgnoreWritesOf(applier.Applier))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	if err := mon.Start(ctx); err != nil {
		t.Fatal(err)
	}

	conn, err := nftables.New(nftables.WithNetNSFd(ns.FD))
	if err != nil {
		t.Fatal(err)
	}
	table := &nftables.Table{Name: "nftproxy", Family: nftables.TableFamilyIPv4}
	tamper := func() error {
		conn.AddRule(&nftables.Rule{Table: table, Chain: &nftables.Chain{Name: "services", Table: table}, Exprs: []expr.Any{&expr.Counter{}}})
		return conn.Flush()
	}

	before := applier.resyncs.Load()
	start := time.Now()
	tampers := 0
	for time.Since(start) < 20*time.Second {
		if err := tamper(); err != nil {
			t.Fatalf("tampering: %v", err)
		}
		tampers++
		time.Sleep(200 * time.Millisecond)
	}
	fought := applier.resyncs.Load() - before
	logMu.Lock()
	nLines := len(lines)
	logMu.Unlock()
	t.Logf("20 s fight: %d foreign transactions, %d full rewrites, %d log lines", tampers, fought, nLines)
	if fought > 8 {
		t.Errorf("%d full rewrites in a 20 s fight, want at most 8 (0, 1, 3, 7, 11, 15, 19 s)", fought)
	}
	if fought < 5 {
		t.Errorf("only %d full rewrites in a 20 s fight: repairs stopped instead of backing off", fought)
	}
	if nLines > 10 {
		t.Errorf("%d log lines in a 20 s fight, want at most 10", nLines)
	}

	// The fight is over: the scheduled repair restores the table within the cap.
	stopped := time.Now()
	waitForWithin(t, "the table restored after the fight", 6*time.Second, func() bool { return list() == want })
	t.Logf("restored %v after the last change", time.Since(stopped).Round(time.Millisecond))

	// After the quiet period (2 s) the backoff is reset (polled: timers run late on a
	// loaded machine), and a one-off change is repaired without waiting out the backoff's
	// cap (4 s): within 3 s.
	waitForWithin(t, "the backoff gauge back to 0 after the quiet period", 10*time.Second, func() bool {
		return strings.Contains(scrapeRegistry(t, rec), "nftproxy_dataplane_repair_backoff_seconds 0")
	})
	if err := tamper(); err != nil {
		t.Fatal(err)
	}
	tampered := time.Now()
	waitForWithin(t, "a one-off change repaired", 3*time.Second, func() bool { return list() == want })
	t.Logf("one-off change after the fight repaired in %v", time.Since(tampered).Round(time.Millisecond))
}

func waitForWithin(t *testing.T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, limit)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func scrapeRegistry(t *testing.T, rec *metrics.Prometheus) string {
	t.Helper()
	mfs, err := rec.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if g := m.GetGauge(); g != nil {
				fmt.Fprintf(&b, "%s %v\n", mf.GetName(), g.GetValue())
			}
		}
	}
	return b.String()
}
