// Package monitor reports changes other processes make to watched nftables tables,
// from the kernel's nf_tables change events. It only reads; it is told explicitly which
// writers' transactions are our own (Writer: nft/kernel's Applier).
package monitor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/wire"
)

// TableID names one nftables table.
type TableID struct {
	Family nft.Family
	Name   string
}

func (t TableID) String() string { return fmt.Sprintf("table %s %s", t.Family, t.Name) }

// Change is one transaction by another process that changed one of the watched tables,
// or a loss of events after which the tables' state is unknown.
type Change struct {
	// Reason says what changed and who committed it, for logs, e.g. "table ip
	// nftproxy: rule deleted in chain svc-a (and 3 more changes), by pid 1234 (nft)".
	Reason string
	// Lost is true when the kernel dropped events (the socket's receive buffer
	// overflowed) that may have been about the watched tables.
	Lost bool
	// PID and Process identify the committing task as the kernel reports it
	// (NFTA_GEN_PROC_PID is a thread id); 0 and "" when unknown.
	PID     uint32
	Process string
}

// Monitor watches nf_tables changes through the kernel's NFNLGRP_NFTABLES multicast
// group and reports every committed transaction that touched one of its tables, except
// those of the Writers given with IgnoreWritesOf: another process's, or another
// netlink socket's of this one. It only reads: it never programs anything.
//
// Which transactions are ours: the kernel stamps each event and the transaction's
// closing NFT_MSG_NEWGEN with the committing socket's port id, and NEWGEN with the
// generation; a Writer (nft/kernel's Applier) knows the port and the generations of
// each of its write sockets. (NFTA_GEN_PROC_PID cannot tell: the kernel reports the committing
// thread's id in the initial pid namespace, which is neither os.Getpid() for a
// multithreaded Go process nor anything the process can see from inside a container's
// pid namespace.)
type Monitor struct {
	tables   map[TableID]bool
	own      []Writer
	onChange func(Change)
	netns    int
	rcvbuf   int
	idle     time.Duration
	// beforeRead, when set (tests only, export_test.go), runs before each receive.
	beforeRead func()

	done chan struct{}
	err  error
	raw  syscall.RawConn // the socket, to grow its receive buffer

	// receive state, owned by the reading goroutine
	pending  []event // events of the transaction in progress on watched tables
	skipped  bool    // events of it were skipped as on one of our open write sockets
	lastGen  uint32  // generation of the last NEWGEN seen (or queried at start)
	lost     bool    // events were dropped since lastGen
	lostWait int     // idle checks made while lost
}

// Writer is a writer of nf_tables whose transactions are our own: nft/kernel's Applier.
type Writer interface {
	// Owns reports whether the transaction of generation gen, committed on the
	// netlink port id port, is the writer's.
	Owns(port, gen uint32) bool
	// Writing reports whether port is one of the writer's open write sockets now.
	Writing(port uint32) bool
}

// Option configures a Monitor.
type Option func(*Monitor)

// NetNS makes the Monitor watch the network namespace open at fd.
func NetNS(fd int) Option { return func(m *Monitor) { m.netns = fd } }

// IgnoreWritesOf makes the Monitor ignore the transactions of these writers.
func IgnoreWritesOf(writers ...Writer) Option {
	return func(m *Monitor) { m.own = append(m.own, writers...) }
}

// owns reports whether the transaction of generation gen, committed on port, is one
// of our writers'.
func (m *Monitor) owns(port, gen uint32) bool {
	for _, w := range m.own {
		if w.Owns(port, gen) {
			return true
		}
	}
	return false
}

// openPort reports whether port is one of our writers' open write sockets.
func (m *Monitor) openPort(port uint32) bool {
	for _, w := range m.own {
		if w.Writing(port) {
			return true
		}
	}
	return false
}

// ReadBuffer sets the socket's receive buffer (default 32 MiB, of which the
// kernel uses what is needed). Rewriting a table of 5,000 services × 10 endpoints
// produces about 11 MB of events, which must fit while the Monitor reads them.
func ReadBuffer(bytes int) Option { return func(m *Monitor) { m.rcvbuf = bytes } }

// New returns a Monitor of the given tables. onChange is called from the
// Monitor's goroutine, once per foreign transaction that changed a watched table and
// once per loss of events; it must not block.
func New(tables []TableID, onChange func(Change), opts ...Option) *Monitor {
	m := &Monitor{tables: map[TableID]bool{}, onChange: onChange, rcvbuf: 32 << 20, idle: 50 * time.Millisecond, done: make(chan struct{})}
	for _, t := range tables {
		m.tables[t] = true
	}
	for _, o := range opts {
		o(m)
	}
	return m
}

// Start subscribes to the kernel's nf_tables events and returns once the subscription
// is active: every transaction committed after Start returns is seen. Events are read
// in a goroutine until ctx ends; Done and Err tell when and why it stopped.
func (m *Monitor) Start(ctx context.Context) error {
	c, err := wire.DialEvents(m.netns)
	if err != nil {
		return err
	}
	if err := m.setup(c); err != nil {
		c.Close()
		return err
	}
	// Transactions committed between the subscription and this query are seen
	// with a generation <= lastGen, which is fine: lastGen only matters after a loss.
	if m.lastGen, err = m.currentGen(); err != nil {
		c.Close()
		return err
	}
	stop := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			c.Close() // unblocks the reader
		case <-stop:
		}
	}()
	go func() {
		defer close(m.done)
		defer close(stop)
		err := m.read(c)
		if ctx.Err() != nil {
			err = nil
		} else {
			c.Close()
		}
		m.err = err
	}()
	return nil
}

// Done is closed when the Monitor has stopped.
func (m *Monitor) Done() <-chan struct{} { return m.done }

// Err is why the Monitor stopped: nil after the context ended. Valid after Done.
func (m *Monitor) Err() error { return m.err }

func (m *Monitor) setup(c *netlink.Conn) error {
	if err := c.JoinGroup(unix.NFNLGRP_NFTABLES); err != nil {
		return fmt.Errorf("joining the nftables multicast group: %w", err)
	}
	var err error
	if m.raw, err = c.SyscallConn(); err != nil {
		return err
	}
	return m.sizeBuffer()
}

// maxReadBuffer bounds the receive buffer's growth after losses.
const maxReadBuffer = 512 << 20

func (m *Monitor) sizeBuffer() error {
	var serr error
	if err := m.raw.Control(func(fd uintptr) {
		// FORCE needs CAP_NET_ADMIN, which programming nftables needs anyway; without
		// it the kernel caps the size at net.core.rmem_max.
		if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, m.rcvbuf); serr != nil {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, m.rcvbuf)
		}
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("sizing the nftables monitor socket's receive buffer: %w", serr)
	}
	return nil
}

// read receives datagrams until the socket is closed or fails.
func (m *Monitor) read(c *netlink.Conn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	buf := make([]byte, 1<<16)
	for {
		if m.beforeRead != nil {
			m.beforeRead()
		}
		var deadline time.Time
		if m.lost {
			deadline = time.Now().Add(m.idle)
		}
		if err := c.SetReadDeadline(deadline); err != nil {
			return err
		}
		var n int
		var rerr error
		err := raw.Read(func(fd uintptr) bool {
			n, _, rerr = unix.Recvfrom(int(fd), buf, unix.MSG_TRUNC)
			return rerr != unix.EAGAIN
		})
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			m.checkLost()
		case err != nil:
			return err
		case errors.Is(rerr, unix.ENOBUFS):
			m.loseEvents() // the kernel dropped events: the socket could not keep up
		case rerr != nil:
			return fmt.Errorf("receiving nftables events: %w", rerr)
		case n > len(buf):
			m.loseEvents() // a datagram larger than the buffer, truncated
		default:
			m.datagram(buf[:n])
		}
	}
}

// datagram handles the netlink messages of one datagram.
func (m *Monitor) datagram(b []byte) {
	if err := wire.Events(b, m.openPort, m.message); err != nil {
		m.loseEvents() // cannot happen; if it does, what followed is unknown
	}
}

// event is one change of a watched table.
type event struct {
	table TableID
	what  string
	rank  int // how much it says about the transaction: the headline is the highest
}

func (m *Monitor) message(ev wire.Event) {
	if ev.Type == unix.NFT_MSG_NEWGEN {
		m.newGen(ev)
		return
	}
	kind, ok := eventKinds[ev.Type]
	if !ok || !ev.Object {
		return // not a change of a table object
	}
	if ev.Skipped {
		// On one of our open write sockets: almost certainly ours (a full rewrite is
		// tens of thousands of events: not worth decoding); the transaction's NEWGEN
		// tells for sure.
		m.skipped = true
		return
	}
	id := TableID{Family: ev.Family, Name: ev.Table}
	if !m.tables[id] {
		return
	}
	what := kind.what
	if kind.named {
		what = fmt.Sprintf(kind.what, ev.Name)
	}
	if len(m.pending) < 1000 { // a flushed table deletes every element: keep a sample
		m.pending = append(m.pending, event{table: id, what: what, rank: kind.rank})
	} else {
		m.pending[len(m.pending)-1].rank = max(m.pending[len(m.pending)-1].rank, kind.rank)
	}
}

// newGen ends a transaction: the kernel sends NFT_MSG_NEWGEN after the events of
// every committed transaction.
func (m *Monitor) newGen(ev wire.Event) {
	port, gen, pid, proc := ev.Port, ev.Gen, ev.PID, ev.Process
	by := fmt.Sprintf("by pid %d (%s)", pid, proc)
	ours := m.owns(port, gen)
	skipped := m.skipped
	m.skipped = false
	if m.lost {
		// Events were dropped. If every transaction since the last one seen
		// complete is ours (consecutive generations, our socket), the dropped
		// events were ours too; otherwise the watched tables may have changed.
		switch {
		case !ours:
			m.report(Change{Reason: "events lost; transaction " + by, Lost: true, PID: pid, Process: proc})
		case gen != nextGen(m.lastGen):
			m.report(Change{Reason: fmt.Sprintf("events lost; generation %d after %d", gen, m.lastGen), Lost: true})
		}
	}
	m.lastGen = gen
	events := m.pending
	m.pending = nil
	switch {
	case m.lost || ours:
	case len(events) > 0:
		m.report(Change{Reason: describe(events) + ", " + by, PID: pid, Process: proc})
	case skipped:
		// Events on the port id of one of our open sockets, in a transaction
		// that is not ours: the port's previous holder committed it before our
		// socket was bound, and we did not look at them.
		m.report(Change{Reason: fmt.Sprintf("changes of unknown tables on port id %d before it was ours, %s", port, by), PID: pid, Process: proc})
	}
}

// nextGen is the generation after g (the kernel skips 0 when it wraps).
func nextGen(g uint32) uint32 {
	if g+1 == 0 {
		return 1
	}
	return g + 1
}

// loseEvents notes that the kernel dropped events, and doubles the receive buffer so
// that a transaction as large does not overflow it again (our own repair of a large
// table would otherwise be lost and reported over and over).
func (m *Monitor) loseEvents() {
	m.lost = true
	m.pending, m.skipped = nil, false
	if m.rcvbuf < maxReadBuffer {
		m.rcvbuf = min(2*m.rcvbuf, maxReadBuffer)
		if m.raw != nil {
			_ = m.sizeBuffer() // best effort: the loss is handled either way
		}
	}
}

// checkLost runs when the socket has been idle after a loss: if the kernel's
// generation is the last one seen, every transaction since the loss was seen and ours.
func (m *Monitor) checkLost() {
	gen, err := m.currentGen()
	switch {
	case err == nil && gen == m.lastGen:
		m.lost, m.lostWait = false, 0 // only our own events were dropped
	case err == nil && m.lostWait < 4:
		m.lostWait++ // a transaction is still being delivered, or its end was dropped
	default:
		reason := fmt.Sprintf("events lost; generation %d, last seen %d", gen, m.lastGen)
		if err != nil {
			reason = "events lost; " + err.Error()
		}
		m.report(Change{Reason: reason, Lost: true})
	}
}

func (m *Monitor) report(c Change) {
	m.lost, m.lostWait, m.pending, m.skipped = false, 0, nil, false
	m.onChange(c)
}

// currentGen asks the kernel for its current ruleset generation.
func (m *Monitor) currentGen() (uint32, error) { return wire.QueryGen(m.netns) }

// eventKind describes one nf_tables event type.
type eventKind struct {
	what  string // with %s for the object's name when named
	named bool
	rank  int // how much it says about the transaction: the headline is the highest
}

var eventKinds = map[uint16]eventKind{
	unix.NFT_MSG_NEWTABLE:     {"table added or changed", false, 6},
	unix.NFT_MSG_DELTABLE:     {"table deleted", false, 7},
	unix.NFT_MSG_NEWCHAIN:     {"chain %s added or changed", true, 4},
	unix.NFT_MSG_DELCHAIN:     {"chain %s deleted", true, 5},
	unix.NFT_MSG_NEWSET:       {"set %s added", true, 4},
	unix.NFT_MSG_DELSET:       {"set %s deleted", true, 5},
	unix.NFT_MSG_NEWRULE:      {"rule added in chain %s", true, 3},
	unix.NFT_MSG_DELRULE:      {"rule deleted in chain %s", true, 3},
	unix.NFT_MSG_NEWSETELEM:   {"element added to set %s", true, 1},
	unix.NFT_MSG_DELSETELEM:   {"element deleted from set %s", true, 2},
	unix.NFT_MSG_NEWOBJ:       {"object %s added", true, 1},
	unix.NFT_MSG_DELOBJ:       {"object %s deleted", true, 1},
	unix.NFT_MSG_NEWFLOWTABLE: {"flowtable %s added", true, 1},
	unix.NFT_MSG_DELFLOWTABLE: {"flowtable %s deleted", true, 1},
}

// describe summarizes a transaction's events on watched tables: the table, the most
// telling change, and how many more there were.
func describe(events []event) string {
	sort.SliceStable(events, func(i, j int) bool { return events[i].rank > events[j].rank })
	head := events[0]
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s", head.table, head.what)
	if n := len(events) - 1; n == 1 {
		b.WriteString(" (and 1 more change)")
	} else if n > 1 {
		more := fmt.Sprint(n)
		if len(events) >= 1000 {
			more = "more than " + more
		}
		fmt.Fprintf(&b, " (and %s more changes)", more)
	}
	return b.String()
}
