package kernel

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/monitor"
	"github.com/nftproxy/nftproxy/nft/wire"
)

// TestMonitorRecycledPortID closes the Applier's write socket and binds a new socket
// of another "process" to the very same netlink port id, as any local process may once
// the id is free: its transaction on our table is reported at once. (Own writes used
// to be recognised by port id for 60 s after the socket closed, so this change went
// unnoticed for a minute.) Our own transactions before and after, on the old and on a
// new socket, stay unreported.
func TestMonitorRecycledPortID(t *testing.T) {
	ns := testnetns.New(t)
	a := New(WithNetNS(ns.FD))
	rs := &nft.Ruleset{Family: nft.IPv4, Table: "nftproxy", Chains: []*nft.Chain{{Name: "services"}}}
	apply := func() {
		t.Helper()
		a.Resync()
		if _, err := a.Apply(rs); err != nil {
			t.Fatal(err)
		}
	}
	apply()
	changes := make(chan monitor.Change, 10)
	mon := monitor.New([]monitor.TableID{{Family: nft.IPv4, Name: "nftproxy"}}, func(c monitor.Change) { changes <- c }, monitor.NetNS(ns.FD), monitor.IgnoreWritesOf(a))
	ctx, cancel := context.WithCancel(t.Context())
	defer func() { cancel(); <-mon.Done() }()
	if err := mon.Start(ctx); err != nil {
		t.Fatal(err)
	}
	none := func(what string) {
		t.Helper()
		select {
		case c := <-changes:
			t.Errorf("%s: reported %+v", what, c)
		case <-time.After(300 * time.Millisecond):
		}
	}

	port := a.port
	for range 3 {
		apply()
	}
	if a.port != port || len(a.own.list) != 1 {
		t.Fatalf("the Applier changed write sockets between successful transactions: %+v", a.own.list)
	}
	none("own rewrites")

	apply()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	intruder, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: ns.FD, PID: port})
	if err != nil {
		t.Fatalf("binding the freed port id %d: %v", port, err)
	}
	defer intruder.Close()
	if got, _ := wire.PortOf(intruder); got != port {
		t.Fatalf("bound port id %d, want %d", got, port)
	}
	b := wire.NewBatch(nft.IPv4, "nftproxy")
	b.DelTable()
	start := time.Now()
	if err := b.Send(intruder); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-changes:
		t.Logf("reported after %v: %s", time.Since(start).Round(time.Microsecond), c.Reason)
		if !strings.Contains(c.Reason, "table ip nftproxy: table deleted") {
			t.Errorf("reason %q does not say the table was deleted", c.Reason)
		}
	case <-time.After(10 * time.Second): // generous: CI runs other tests alongside
		t.Fatalf("a transaction on the recycled port id %d was not reported within 10s", port)
	}

	// our next transaction opens a new socket (the intruder holds the old id)
	apply()
	if a.port == port {
		t.Fatalf("new write socket on port %d, which another socket holds", port)
	}
	none("own rewrite on a new socket")
}

// TestApplierRetiresSocketAfterRefusal: a refused transaction leaves the write socket
// in an unknown state (late answers), so the Applier closes it and records it; the
// next transaction goes out on a new socket and is still recognised as ours.
func TestApplierRetiresSocketAfterRefusal(t *testing.T) {
	ns := testnetns.New(t)
	a := New(WithNetNS(ns.FD))
	good := &nft.Ruleset{Family: nft.IPv4, Table: "nftproxy", Chains: []*nft.Chain{{Name: "services"}}}
	if _, err := a.Apply(good); err != nil {
		t.Fatal(err)
	}
	first := a.port
	bad := &nft.Ruleset{Family: nft.IPv4, Table: "nftproxy", Chains: []*nft.Chain{
		{Name: "services", Rules: []nft.Rule{{Stmts: []nft.Stmt{nft.Verdict{Kind: nft.Goto, Chain: "no-such-chain"}}}}},
	}}
	if _, err := a.Apply(bad); err == nil {
		t.Fatal("the kernel accepted a jump to a missing chain")
	}
	if a.conn != nil {
		t.Fatal("write socket kept after a refused transaction")
	}
	if _, err := a.Apply(good); err != nil {
		t.Fatal(err)
	}
	if len(a.own.list) != 2 || a.own.list[0].open || !a.own.list[1].open || a.own.list[0].port != first {
		t.Fatalf("sockets %+v: want the first closed, a second open", a.own.list)
	}
	if w := a.own.list[0]; !genAfter(w.until, w.after) {
		t.Errorf("closed socket's interval (%d, %d] is empty", w.after, w.until)
	}
}

// TestSocketIntervals: a write socket's transactions are those after its opening and,
// once closed, up to the generation after closing; Owns and Writing say so.
func TestSocketIntervals(t *testing.T) {
	a := New()
	a.own.opened(7, 5)
	if !a.Writing(7) || a.Owns(7, 5) || !a.Owns(7, 6) || !a.Owns(7, 1000) {
		t.Fatal("open socket: want every generation after 5, and the port writing")
	}
	a.own.closed(7, 22)
	if a.Writing(7) || a.Owns(7, 23) || !a.Owns(7, 22) || !a.Owns(7, 6) || a.Owns(7, 5) {
		t.Error("generation intervals of the closed socket are wrong")
	}
	if a.Owns(8, 10) {
		t.Error("another port is ours")
	}
}
