package kernel

import (
	"context"
	"encoding/binary"
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
// those of the Appliers given with MonitorOwnWrites: another process's, or another
// netlink socket's of this one. It only reads: it never programs anything.
//
// Which transactions are ours: the kernel stamps each event and the transaction's
// closing NFT_MSG_NEWGEN with the committing socket's port id, and NEWGEN with the
// generation; an Applier knows the port and the generations of each of its write
// sockets (own.go). (NFTA_GEN_PROC_PID cannot tell: the kernel reports the committing
// thread's id in the initial pid namespace, which is neither os.Getpid() for a
// multithreaded Go process nor anything the process can see from inside a container's
// pid namespace.)
type Monitor struct {
	tables   map[TableID]bool
	own      []*Applier
	onChange func(Change)
	netns    int
	rcvbuf   int
	idle     time.Duration

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

// MonitorOption configures a Monitor.
type MonitorOption func(*Monitor)

// MonitorNetNS makes the Monitor watch the network namespace open at fd.
func MonitorNetNS(fd int) MonitorOption { return func(m *Monitor) { m.netns = fd } }

// MonitorOwnWrites makes the Monitor ignore the transactions of these Appliers.
func MonitorOwnWrites(appliers ...*Applier) MonitorOption {
	return func(m *Monitor) { m.own = append(m.own, appliers...) }
}

// owns reports whether the transaction of generation gen, committed on port, is one
// of our Appliers'.
func (m *Monitor) owns(port, gen uint32) bool {
	for _, a := range m.own {
		if a.own.owns(port, gen) {
			return true
		}
	}
	return false
}

// openPort reports whether port is one of our Appliers' open write sockets.
func (m *Monitor) openPort(port uint32) bool {
	for _, a := range m.own {
		if a.own.openPort(port) {
			return true
		}
	}
	return false
}

// MonitorReadBuffer sets the socket's receive buffer (default 32 MiB, of which the
// kernel uses what is needed). Rewriting a table of 5,000 services × 10 endpoints
// produces about 11 MB of events, which must fit while the Monitor reads them.
func MonitorReadBuffer(bytes int) MonitorOption { return func(m *Monitor) { m.rcvbuf = bytes } }

// NewMonitor returns a Monitor of the given tables. onChange is called from the
// Monitor's goroutine, once per foreign transaction that changed a watched table and
// once per loss of events; it must not block.
func NewMonitor(tables []TableID, onChange func(Change), opts ...MonitorOption) *Monitor {
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
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: m.netns})
	if err != nil {
		return fmt.Errorf("opening nftables monitor socket: %w", err)
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
	for len(b) >= unix.NLMSG_HDRLEN {
		l := int(binary.NativeEndian.Uint32(b[0:4]))
		if l < unix.NLMSG_HDRLEN || l > len(b) {
			m.loseEvents() // cannot happen; if it does, what followed is unknown
			return
		}
		typ := binary.NativeEndian.Uint16(b[4:6])
		port := binary.NativeEndian.Uint32(b[12:16])
		m.message(typ, port, b[unix.NLMSG_HDRLEN:l])
		b = b[min((l+unix.NLMSG_ALIGNTO-1)&^(unix.NLMSG_ALIGNTO-1), len(b)):]
	}
}

// event is one change of a watched table.
type event struct {
	table TableID
	what  string
	rank  int // how much it says about the transaction: the headline is the highest
}

func (m *Monitor) message(typ uint16, port uint32, data []byte) {
	if typ>>8 != unix.NFNL_SUBSYS_NFTABLES || len(data) < 4 {
		return
	}
	msg := typ & 0xff
	if msg == unix.NFT_MSG_NEWGEN {
		m.newGen(port, data[4:])
		return
	}
	kind, ok := eventKinds[msg]
	if !ok {
		return // not a change of a table object
	}
	if m.openPort(port) {
		// Almost certainly ours (a full rewrite is tens of thousands of events: not
		// worth decoding); the transaction's NEWGEN tells for sure.
		m.skipped = true
		return
	}
	table, name := tableAndName(data[4:], kind.nameAttr)
	id := TableID{Family: nft.Family(data[0]), Name: table}
	if !m.tables[id] {
		return
	}
	what := kind.what
	if kind.nameAttr != 0 {
		what = fmt.Sprintf(kind.what, name)
	}
	if len(m.pending) < 1000 { // a flushed table deletes every element: keep a sample
		m.pending = append(m.pending, event{table: id, what: what, rank: kind.rank})
	} else {
		m.pending[len(m.pending)-1].rank = max(m.pending[len(m.pending)-1].rank, kind.rank)
	}
}

// newGen ends a transaction: the kernel sends NFT_MSG_NEWGEN after the events of
// every committed transaction.
func (m *Monitor) newGen(port uint32, attrs []byte) {
	var gen, pid uint32
	var proc string
	if ad, err := netlink.NewAttributeDecoder(attrs); err == nil {
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			switch ad.Type() {
			case unix.NFTA_GEN_ID:
				gen = ad.Uint32()
			case unix.NFTA_GEN_PROC_PID:
				pid = ad.Uint32()
			case unix.NFTA_GEN_PROC_NAME:
				proc = ad.String()
			}
		}
	}
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

// currentGen asks the kernel for its current ruleset generation (NFT_MSG_GETGEN).
func (m *Monitor) currentGen() (uint32, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: m.netns})
	if err != nil {
		return 0, fmt.Errorf("opening nftables socket: %w", err)
	}
	defer c.Close()
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN), Flags: netlink.Request},
		Data:   []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	})
	if err != nil {
		return 0, fmt.Errorf("querying the nftables generation: %w", err)
	}
	for _, msg := range msgs {
		if len(msg.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(msg.Data[4:])
		if err != nil {
			return 0, err
		}
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			if ad.Type() == unix.NFTA_GEN_ID {
				return ad.Uint32(), nil
			}
		}
	}
	return 0, errors.New("querying the nftables generation: no generation in the answer")
}

// eventKind describes one nf_tables event type. Every one carries its table's name in
// attribute 1 (NFTA_TABLE_NAME, NFTA_CHAIN_TABLE, NFTA_RULE_TABLE, NFTA_SET_TABLE,
// NFTA_SET_ELEM_LIST_TABLE, NFTA_OBJ_TABLE, NFTA_FLOWTABLE_TABLE).
type eventKind struct {
	what     string // with %s for the object's name when nameAttr != 0
	nameAttr uint16
	rank     int
}

var eventKinds = map[uint16]eventKind{
	unix.NFT_MSG_NEWTABLE:     {"table added or changed", 0, 6},
	unix.NFT_MSG_DELTABLE:     {"table deleted", 0, 7},
	unix.NFT_MSG_NEWCHAIN:     {"chain %s added or changed", unix.NFTA_CHAIN_NAME, 4},
	unix.NFT_MSG_DELCHAIN:     {"chain %s deleted", unix.NFTA_CHAIN_NAME, 5},
	unix.NFT_MSG_NEWSET:       {"set %s added", unix.NFTA_SET_NAME, 4},
	unix.NFT_MSG_DELSET:       {"set %s deleted", unix.NFTA_SET_NAME, 5},
	unix.NFT_MSG_NEWRULE:      {"rule added in chain %s", unix.NFTA_RULE_CHAIN, 3},
	unix.NFT_MSG_DELRULE:      {"rule deleted in chain %s", unix.NFTA_RULE_CHAIN, 3},
	unix.NFT_MSG_NEWSETELEM:   {"element added to set %s", unix.NFTA_SET_ELEM_LIST_SET, 1},
	unix.NFT_MSG_DELSETELEM:   {"element deleted from set %s", unix.NFTA_SET_ELEM_LIST_SET, 2},
	unix.NFT_MSG_NEWOBJ:       {"object %s added", unix.NFTA_OBJ_NAME, 1},
	unix.NFT_MSG_DELOBJ:       {"object %s deleted", unix.NFTA_OBJ_NAME, 1},
	unix.NFT_MSG_NEWFLOWTABLE: {"flowtable %s added", nftaFlowtableName, 1},
	unix.NFT_MSG_DELFLOWTABLE: {"flowtable %s deleted", nftaFlowtableName, 1},
}

const nftaFlowtableName = 2 // NFTA_FLOWTABLE_NAME

// tableAndName returns an event's table name (attribute 1) and, if nameAttr != 0, the
// name of the object it is about.
func tableAndName(attrs []byte, nameAttr uint16) (table, name string) {
	ad, err := netlink.NewAttributeDecoder(attrs)
	if err != nil {
		return "", ""
	}
	for ad.Next() {
		switch ad.Type() {
		case 1:
			table = ad.String()
		case nameAttr:
			if nameAttr != 0 {
				name = ad.String()
			}
		}
	}
	return table, name
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
