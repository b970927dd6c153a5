package monitor_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
	"github.com/nftproxy/nftproxy/nft/monitor"
)

var ourTables = []monitor.TableID{{Family: nft.IPv4, Name: "nftproxy"}, {Family: nft.IPv6, Name: "nftproxy"}}

// watch starts a Monitor of ourTables in ns whose changes arrive on the returned channel.
func watch(t *testing.T, ns *testnetns.NS, opts ...monitor.Option) (*monitor.Monitor, <-chan monitor.Change, context.CancelFunc) {
	t.Helper()
	changes := make(chan monitor.Change, 100)
	mon := monitor.New(ourTables, func(c monitor.Change) { changes <- c }, append(opts, monitor.NetNS(ns.FD))...)
	ctx, cancel := context.WithCancel(t.Context())
	if err := mon.Start(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		<-mon.Done()
	})
	return mon, changes, cancel
}

// changeWait bounds the wait for a report. Reports come within milliseconds, or a
// few hundred after a loss (the rest of the transaction is read, then the generation
// checked); the bound is generous because CI runs other packages' tests alongside.
const changeWait = 10 * time.Second

// expectNone checks that no change is reported for a while.
func expectNone(t *testing.T, changes <-chan monitor.Change, what string) {
	t.Helper()
	select {
	case c := <-changes:
		t.Errorf("%s: unexpected change reported: %+v", what, c)
	case <-time.After(300 * time.Millisecond):
	}
}

// expectChange waits up to a second for a change whose reason contains every want.
func expectChange(t *testing.T, changes <-chan monitor.Change, since time.Time, what string, want ...string) monitor.Change {
	t.Helper()
	select {
	case c := <-changes:
		took := time.Since(since)
		t.Logf("%s: reported after %v: %s", what, took.Round(time.Microsecond), c.Reason)
		for _, w := range want {
			if !strings.Contains(c.Reason, w) {
				t.Errorf("%s: reason %q does not contain %q", what, c.Reason, w)
			}
		}
		return c
	case <-time.After(changeWait):
		t.Fatalf("%s: no change reported within %v", what, changeWait)
	}
	return monitor.Change{}
}

// TestMonitor tampers with an applied table in every way the monitor must notice, from
// the nft binary and from another netlink socket of this process, and checks that our
// own transactions and changes to other tables go unreported.
func TestMonitor(t *testing.T) {
	ns := testnetns.New(t)
	applier := kernel.New(kernel.WithNetNS(ns.FD))
	slots := compile.NewSlots()
	// a is on the flat path (elements of shared sets and maps, shared chains); b, with
	// session affinity, has chains of its own and a service-ips element
	b := svc("b", "10.96.0.2", 0, 10, 2)
	b.AffinityTimeout = 10800
	snap := &model.Snapshot{Services: model.Ports([]model.ServicePort{svc("a", "10.96.0.1", 30080, 0, 2), b})}
	rs, _ := compile.Compile(snap, cfg(), slots)
	if _, err := applier.Apply(rs); err != nil {
		t.Fatal(err)
	}
	want := listTable(t, ns)
	mon, changes, cancel := watch(t, ns, monitor.IgnoreWritesOf(applier))

	// repair rewrites the table as the controller does after a reported change, and
	// checks that the rewrite, being ours, is not reported.
	repair := func(what string) {
		t.Helper()
		applier.Resync()
		if _, err := applier.Apply(rs); err != nil {
			t.Fatal(err)
		}
		if got := listTable(t, ns); got != want {
			t.Fatalf("%s: repair did not restore the table\n--- want:\n%s\n--- got:\n%s", what, want, got)
		}
		expectNone(t, changes, what+": our repair")
	}
	nftCmd := func(what string, args ...string) monitor.Change {
		t.Helper()
		ns.MustRun(t, "", args...)
		c := expectChange(t, changes, time.Now(), what)
		if c.Process != "nft" || c.PID == 0 || c.PID == uint32(os.Getpid()) || c.Lost {
			t.Errorf("%s: change attributed to pid %d (%s), lost %v; want the nft process", what, c.PID, c.Process, c.Lost)
		}
		return c
	}

	t.Run("own-transactions-unreported", func(t *testing.T) {
		// a full rewrite, an incremental one (one more endpoint), and back
		for _, n := range []int{2, 3, 2} {
			sp := svc("a", "10.96.0.1", 30080, 0, n)
			snap.Services[0] = &sp
			next, _ := compile.Compile(snap, cfg(), slots)
			applier.Resync()
			if _, err := applier.Apply(next); err != nil {
				t.Fatal(err)
			}
			rs = next
		}
		expectNone(t, changes, "own applies")
		want = listTable(t, ns)
	})

	t.Run("nft-delete-element", func(t *testing.T) {
		start := time.Now()
		ns.MustRun(t, "", "nft", "delete", "element", "ip", "nftproxy", "service-ips", "{ 10.96.0.2 . tcp . 80 }")
		c := expectChange(t, changes, start, "delete element", "table ip nftproxy: element deleted from set service-ips", "(nft)")
		if c.Process != "nft" || c.PID == uint32(os.Getpid()) {
			t.Errorf("change attributed to pid %d (%s), want the nft process", c.PID, c.Process)
		}
		repair("delete element")
	})
	t.Run("nft-delete-endpoint-entry", func(t *testing.T) {
		c := nftCmd("delete endpoint entry", "nft", "delete", "element", "ip", "nftproxy", "endpoints", "{ 10.96.0.1 . tcp . 80 . 1 }")
		if !strings.Contains(c.Reason, "table ip nftproxy: element deleted from set endpoints,") {
			t.Errorf("reason %q does not name the map", c.Reason)
		}
		repair("delete endpoint entry")
	})
	t.Run("nft-add-endpoint-count-bit", func(t *testing.T) {
		c := nftCmd("add endpoint count bit", "nft", "add", "element", "ip", "nftproxy", "endpoint-count-bit0", "{ 10.96.0.1 . tcp . 80 }")
		if !strings.Contains(c.Reason, "element added to set endpoint-count-bit0") {
			t.Errorf("reason %q does not name the set", c.Reason)
		}
		repair("add endpoint count bit")
	})
	t.Run("nft-flush-chain", func(t *testing.T) {
		nftCmd("flush chain", "nft", "flush", "chain", "ip", "nftproxy", "svc-default/b/tcp/http")
		repair("flush chain")
	})
	t.Run("nft-flush-shared-chain", func(t *testing.T) {
		nftCmd("flush shared chain", "nft", "flush", "chain", "ip", "nftproxy", "cluster-frontend")
		repair("flush shared chain")
	})
	t.Run("nft-add-rule", func(t *testing.T) {
		c := nftCmd("add rule", "nft", "add", "rule", "ip", "nftproxy", "services", "counter", "drop")
		if !strings.Contains(c.Reason, "rule added in chain services") {
			t.Errorf("reason %q does not name the rule and chain", c.Reason)
		}
		repair("add rule")
	})
	t.Run("nft-add-chain-and-set", func(t *testing.T) {
		ns.MustRun(t, "add chain ip nftproxy intruder\nadd set ip nftproxy intruders { type ipv4_addr; }\n", "nft", "-f", "-")
		c := expectChange(t, changes, time.Now(), "add chain and set", "(and 1 more change), by pid ")
		if !strings.Contains(c.Reason, "chain intruder added") && !strings.Contains(c.Reason, "set intruders added") {
			t.Errorf("reason %q names neither the chain nor the set", c.Reason)
		}
		repair("add chain and set")
	})
	t.Run("nft-delete-table", func(t *testing.T) {
		c := nftCmd("delete table", "nft", "delete", "table", "ip", "nftproxy")
		if !strings.Contains(c.Reason, "table ip nftproxy: table deleted") {
			t.Errorf("reason %q does not say the table was deleted", c.Reason)
		}
		repair("delete table")
	})
	t.Run("netlink-flush-chain", func(t *testing.T) {
		// Another netlink socket of this very process is not ours either: only the
		// Appliers' transactions are.
		conn, err := nftables.New(nftables.WithNetNSFd(ns.FD))
		if err != nil {
			t.Fatal(err)
		}
		conn.FlushChain(&nftables.Chain{Name: "cluster-frontend", Table: &nftables.Table{Name: "nftproxy", Family: nftables.TableFamilyIPv4}})
		start := time.Now()
		if err := conn.Flush(); err != nil {
			t.Fatal(err)
		}
		c := expectChange(t, changes, start, "netlink flush chain", "rule deleted in chain cluster-frontend")
		// The kernel names the committing thread: one of this process's.
		if _, err := os.Stat(fmt.Sprintf("/proc/self/task/%d", c.PID)); err != nil || c.Lost {
			t.Errorf("change attributed to pid %d (%s), lost %v; want a thread of this process: %v", c.PID, c.Process, c.Lost, err)
		}
		repair("netlink flush chain")
	})
	t.Run("other-tables-unreported", func(t *testing.T) {
		ns.MustRun(t, `
table ip other {
	chain c { type filter hook input priority 0; counter accept; }
	set s { type ipv4_addr; elements = { 192.0.2.1 } }
}
table inet nftproxy {
	chain services { counter; }
}
table ip6 elsewhere { chain services { }; }
`, "nft", "-f", "-")
		ns.MustRun(t, "", "nft", "flush", "chain", "ip", "other", "c")
		ns.MustRun(t, "", "nft", "delete", "element", "ip", "other", "s", "{ 192.0.2.1 }")
		ns.MustRun(t, "", "nft", "delete", "table", "inet", "nftproxy")
		ns.MustRun(t, "", "nft", "delete", "table", "ip", "other")
		// A transaction the kernel refuses commits nothing.
		if out, err := ns.Run(t, "", "nft", "add", "rule", "ip", "nftproxy", "no-such-chain", "drop"); err == nil {
			t.Fatalf("nft accepted a rule in a missing chain: %s", out)
		}
		expectNone(t, changes, "other tables")
		if got := listTable(t, ns); got != want {
			t.Fatalf("our table changed\n--- want:\n%s\n--- got:\n%s", want, got)
		}
	})
	t.Run("stops-on-cancel", func(t *testing.T) {
		cancel()
		select {
		case <-mon.Done():
		case <-time.After(changeWait):
			t.Fatalf("monitor still running %v after its context ended", changeWait)
		}
		if err := mon.Err(); err != nil {
			t.Errorf("monitor stopped with %v, want nil after cancel", err)
		}
		ns.MustRun(t, "", "nft", "delete", "table", "ip", "nftproxy")
		expectNone(t, changes, "after stop")
	})
}

// TestMonitorLostEvents makes the kernel drop events (a tiny receive buffer, reads held
// while nft commits a transaction of 40,000 elements): the loss is reported, since what
// was dropped may have been about our table.
func TestMonitorLostEvents(t *testing.T) {
	ns := testnetns.New(t)
	applier := kernel.New(kernel.WithNetNS(ns.FD))
	rs, _ := compile.Compile(&model.Snapshot{Services: model.Ports([]model.ServicePort{svc("a", "10.96.0.1", 30080, 0, 2)})}, cfg(), compile.NewSlots())
	if _, err := applier.Apply(rs); err != nil {
		t.Fatal(err)
	}
	// Reads are held until nft is done: the kernel then overflows the 4 KiB buffer for
	// certain (an idle machine's reader could otherwise keep up and lose nothing).
	gate := make(chan struct{})
	_, changes, _ := watch(t, ns, monitor.ReadBuffer(4096), monitor.ReadGate(gate))
	var b strings.Builder
	b.WriteString("add table ip other\nadd set ip other big { type ipv4_addr; }\nadd element ip other big { ")
	for i := 0; i < 40000; i++ {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "10.%d.%d.%d", i/62500, i/250%250, 1+i%250)
	}
	b.WriteString(" }\n")
	start := time.Now()
	ns.MustRun(t, b.String(), "nft", "-f", "-")
	close(gate)
	c := expectChange(t, changes, start, "40,000 elements in another table through a 4 KiB buffer", "events lost")
	if !c.Lost {
		t.Errorf("change %+v: Lost is false", c)
	}
}

// TestMonitorLargeOwnTransaction rewrites a table of 5,000 services × 10 endpoints
// (about 125,000 element events on the flat path) twice: with the default receive buffer nothing is lost and
// nothing reported.
func TestMonitorLargeOwnTransaction(t *testing.T) {
	ns := testnetns.New(t)
	var svcs []model.ServicePort
	for i := 0; i < 5000; i++ {
		svcs = append(svcs, svc(fmt.Sprintf("s%05d", i), fmt.Sprintf("10.96.%d.%d", i/250, 1+i%250), 0, i*10, 10))
	}
	rs, _ := compile.Compile(&model.Snapshot{Services: model.Ports(svcs)}, cfg(), compile.NewSlots())
	applier := kernel.New(kernel.WithNetNS(ns.FD))
	_, changes, _ := watch(t, ns, monitor.IgnoreWritesOf(applier))
	for i := 0; i < 2; i++ {
		applier.Resync()
		st, err := applier.Apply(rs)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("full apply %d: %d messages, %d elements, kernel %v", i, st.Messages, st.Elements, st.Kernel)
	}
	expectNone(t, changes, "two full rewrites of 5,000 services")
}
