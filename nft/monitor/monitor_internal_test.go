package monitor

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft"
)

// The Monitor's bookkeeping, fed with synthetic event datagrams: which transactions
// are reported, and how a loss of events is resolved when the next generation shows
// that only our own transactions happened in between.

const ownPort, otherPort = 0x7fff0001, 4242

func nlmsg(typ uint16, fam byte, port uint32, attrs func(ae *netlink.AttributeEncoder)) []byte {
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian
	attrs(ae)
	data, err := ae.Encode()
	if err != nil {
		panic(err)
	}
	b := make([]byte, unix.NLMSG_HDRLEN+4, unix.NLMSG_HDRLEN+4+len(data)+4)
	b = append(b, data...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	binary.NativeEndian.PutUint32(b[0:4], uint32(len(b)))
	binary.NativeEndian.PutUint16(b[4:6], unix.NFNL_SUBSYS_NFTABLES<<8|typ)
	binary.NativeEndian.PutUint32(b[12:16], port)
	b[unix.NLMSG_HDRLEN] = fam
	return b
}

func delElem(port uint32, table string) []byte {
	return nlmsg(unix.NFT_MSG_DELSETELEM, byte(nft.IPv4), port, func(ae *netlink.AttributeEncoder) {
		ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, table)
		ae.String(unix.NFTA_SET_ELEM_LIST_SET, "service-ips")
	})
}

func newGenMsg(port, gen, pid uint32, proc string) []byte {
	return nlmsg(unix.NFT_MSG_NEWGEN, 0, port, func(ae *netlink.AttributeEncoder) {
		ae.Uint32(unix.NFTA_GEN_ID, gen)
		ae.Uint32(unix.NFTA_GEN_PROC_PID, pid)
		ae.String(unix.NFTA_GEN_PROC_NAME, proc)
	})
}

// fakeWriter is a Writer with write sockets given by hand: a port is ours for the
// generations after it was bound and, once closed, up to the generation after closing.
type fakeWriter struct{ sockets []fakeSocket }

type fakeSocket struct {
	port, after, until uint32
	open               bool
}

func (w *fakeWriter) opened(port, gen uint32) {
	w.sockets = append(w.sockets, fakeSocket{port: port, after: gen, open: true})
}

func (w *fakeWriter) closed(port, gen uint32) {
	for i := range w.sockets {
		if s := &w.sockets[i]; s.open && s.port == port {
			s.open, s.until = false, gen
		}
	}
}

func (w *fakeWriter) Owns(port, gen uint32) bool {
	for _, s := range w.sockets {
		if s.port == port && int32(gen-s.after) > 0 && (s.open || int32(gen-s.until) <= 0) {
			return true
		}
	}
	return false
}

func (w *fakeWriter) Writing(port uint32) bool {
	for _, s := range w.sockets {
		if s.open && s.port == port {
			return true
		}
	}
	return false
}

func TestMonitorBookkeeping(t *testing.T) {
	a := &fakeWriter{}
	a.opened(ownPort, 5) // our write socket, bound at generation 5
	var got []Change
	m := New([]TableID{{nft.IPv4, "nftproxy"}}, func(c Change) { got = append(got, c) }, IgnoreWritesOf(a))
	m.lastGen = 10
	feed := func(msgs ...[]byte) {
		var b []byte
		for _, msg := range msgs {
			b = append(b, msg...)
		}
		m.datagram(b)
	}
	expect := func(what string, n int, reason string, lost bool) {
		t.Helper()
		if len(got) != n {
			t.Fatalf("%s: %d changes reported, want %d: %+v", what, len(got), n, got)
		}
		if reason != "" && (!strings.Contains(got[n-1].Reason, reason) || got[n-1].Lost != lost) {
			t.Fatalf("%s: reported %+v, want reason containing %q, lost %v", what, got[n-1], reason, lost)
		}
	}

	feed(delElem(ownPort, "nftproxy"), newGenMsg(ownPort, 11, 99, "nftproxy"))
	expect("own transaction", 0, "", false)
	feed(delElem(otherPort, "other"), newGenMsg(otherPort, 12, 1234, "nft"))
	expect("foreign transaction on another table", 0, "", false)
	feed(delElem(otherPort, "nftproxy"), delElem(otherPort, "nftproxy"), newGenMsg(otherPort, 13, 1234, "nft"))
	expect("foreign transaction on ours", 1,
		"table ip nftproxy: element deleted from set service-ips (and 1 more change), by pid 1234 (nft)", false)

	// Events lost, then our own transactions with consecutive generations: nothing.
	m.loseEvents()
	feed(delElem(ownPort, "nftproxy"), newGenMsg(ownPort, 14, 99, "nftproxy"), newGenMsg(ownPort, 15, 99, "nftproxy"))
	expect("lost during own transactions", 1, "", false)
	// ... but a foreign transaction among them: reported as a loss.
	feed(newGenMsg(ownPort, 16, 99, "nftproxy"))
	m.loseEvents()
	feed(newGenMsg(otherPort, 17, 555, "iptables-nft"))
	expect("lost during a foreign transaction", 2, "events lost; transaction by pid 555 (iptables-nft)", true)
	// ... or a generation skipped: its NEWGEN was dropped too.
	m.loseEvents()
	feed(newGenMsg(ownPort, 19, 99, "nftproxy"))
	expect("lost with a generation gap", 3, "events lost; generation 19 after 17", true)
	// After a report the monitor is back to normal.
	feed(newGenMsg(ownPort, 20, 99, "nftproxy"))
	expect("normal again", 3, "", false)

	// A truncated message: what followed is unknown.
	bad := delElem(otherPort, "nftproxy")
	binary.NativeEndian.PutUint32(bad[0:4], uint32(len(bad)+100))
	feed(bad)
	if !m.lost {
		t.Fatal("a malformed datagram did not count as lost events")
	}
	m.lost = false

	// Our socket is closed at generation 22: a late event of its last transaction
	// is still ours, a later transaction on the same (recycled) port id is not.
	m.lastGen = 21
	a.closed(ownPort, 22)
	feed(delElem(ownPort, "nftproxy"), newGenMsg(ownPort, 22, 99, "nftproxy"))
	expect("late event of our closed socket", 3, "", false)
	feed(delElem(ownPort, "nftproxy"), newGenMsg(ownPort, 23, 4321, "intruder"))
	expect("recycled port id", 4, "element deleted from set service-ips, by pid 4321 (intruder)", false)

	// A new socket of ours bound at generation 30 on a port whose previous holder's
	// transaction (generation 24) is only read now: not ours, although its events
	// were skipped as being on our open socket's port.
	a.opened(otherPort+1, 30)
	feed(delElem(otherPort+1, "nftproxy"), newGenMsg(otherPort+1, 24, 555, "nft"))
	expect("previous holder of our port", 5, "before it was ours, by pid 555 (nft)", false)
	feed(delElem(otherPort+1, "nftproxy"), newGenMsg(otherPort+1, 31, 99, "nftproxy"))
	expect("our new socket", 5, "", false)
}
