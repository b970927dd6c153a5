package kernel

import (
	"fmt"
	"sync"

	"github.com/mdlayher/netlink"

	"github.com/nftproxy/nftproxy/nft/wire"
)

// Which transactions are an Applier's own.
//
// The kernel stamps every nf_tables event, and the NFT_MSG_NEWGEN that closes each
// committed transaction, with the netlink port id of the socket that committed it,
// and NEWGEN with the transaction's generation. A port id is unique in its network
// namespace only while its socket is open: once closed, any local process may bind the
// same id (explicitly, or by chance). So an Applier writes on one socket that it keeps
// open for its lifetime, and records the generations that bound each of its write
// sockets: the generation just after binding (every transaction of an earlier holder of
// the port is at or before it) and, once closed, the generation just after closing
// (every transaction of ours is at or before it). A transaction is ours exactly when its
// port is one of those sockets' and its generation lies in that socket's interval: no
// time window in which someone else's transaction on a recycled port id is ignored.
// A monitor (nft/monitor) is told the Appliers whose transactions it must ignore
// (monitor.IgnoreWritesOf, through Owns and Writing): there is no process-wide registry.

// writeSocket is one of an Applier's write sockets, as the Monitor sees it.
type writeSocket struct {
	port  uint32
	after uint32 // generation when it was bound: its transactions are later
	until uint32 // generation after it was closed: its transactions are not later
	open  bool
}

// maxRetiredSockets bounds the closed sockets an Applier remembers. A socket is only
// closed after a failed transaction, or by Close; forgetting one makes its late
// events count as someone else's (a needless repair), never the reverse.
const maxRetiredSockets = 16

// sockets is an Applier's record of its write sockets, read by Monitors.
type sockets struct {
	mu   sync.Mutex
	list []writeSocket
}

func (s *sockets) opened(port, gen uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.list = append(s.list, writeSocket{port: port, after: gen, open: true})
}

func (s *sockets) closed(port, gen uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.list {
		if w := &s.list[i]; w.open && w.port == port {
			w.open, w.until = false, gen
		}
	}
	if n := len(s.list); n > maxRetiredSockets {
		s.list = append(s.list[:0:0], s.list[n-maxRetiredSockets:]...)
	}
}

// owns reports whether the transaction of generation gen committed on port is ours.
func (s *sockets) owns(port, gen uint32) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.list {
		if w.port == port && genAfter(gen, w.after) && (w.open || !genAfter(gen, w.until)) {
			return true
		}
	}
	return false
}

// openPort reports whether port is one of our open write sockets now: then an event
// on it is almost certainly ours (owns, at the transaction's NEWGEN, decides).
func (s *sockets) openPort(port uint32) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.list {
		if w.open && w.port == port {
			return true
		}
	}
	return false
}

// Owns reports whether the transaction of generation gen, committed on the netlink port
// id port, is this Applier's (monitor.Writer).
func (a *Applier) Owns(port, gen uint32) bool { return a.own.owns(port, gen) }

// Writing reports whether port is one of this Applier's open write sockets
// (monitor.Writer).
func (a *Applier) Writing(port uint32) bool { return a.own.openPort(port) }

// genAfter reports whether generation a comes after b (the 32-bit counter wraps).
func genAfter(a, b uint32) bool { return int32(a-b) > 0 }

// writer returns the Applier's write socket, opening and recording it if needed.
func (a *Applier) writer() (*netlink.Conn, error) {
	if a.conn != nil {
		return a.conn, nil
	}
	c, err := a.dial()
	if err != nil {
		return nil, err
	}
	// bound first, generation second: an earlier holder of the port committed at
	// or before gen
	gen, err := wire.GenID(c)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("opening the nftables write socket: %w", err)
	}
	port, err := wire.PortOf(c)
	if err != nil {
		c.Close()
		return nil, err
	}
	a.own.opened(port, gen)
	a.port = port
	a.conn = c
	return c, nil
}

// retire closes the write socket (after a failed transaction its receive queue may
// hold stale answers) and records the generation after which its port is not ours.
func (a *Applier) retire() error {
	c := a.conn
	if c == nil {
		return nil
	}
	a.conn = nil
	port := a.port
	cerr := c.Close()
	// closed first, generation second: every transaction of ours is at or before gen.
	// Should the query fail, nothing after the socket's opening stays ours (a late
	// event of ours then only causes a needless repair).
	gen := uint32(0)
	a.own.mu.Lock()
	for _, w := range a.own.list {
		if w.open && w.port == port {
			gen = w.after
		}
	}
	a.own.mu.Unlock()
	var gerr error
	if q, err := a.dial(); err != nil {
		gerr = err
	} else {
		if g, err := wire.GenID(q); err == nil {
			gen = g
		} else {
			gerr = err
		}
		q.Close()
	}
	a.own.closed(port, gen)
	if cerr != nil {
		return cerr
	}
	return gerr
}

// Close closes the Applier's write socket. The Applier stays usable: the next
// transaction opens a new one.
func (a *Applier) Close() error { return a.retire() }
