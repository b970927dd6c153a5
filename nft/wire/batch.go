package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft"
)

// elemChunk bounds the elements per NEWSETELEM message, so that no single netlink
// attribute overflows its 16-bit length.
const elemChunk = 512

// pageSize is the size at which a batch starts a new buffer. Messages are written
// straight into these pages (no per-message or per-attribute allocation) and the pages
// go to the kernel as the iovecs of one sendmsg, so a 50 MB transaction is never copied.
// The first page starts small and grows by append: most syncs are a few hundred bytes,
// and a megabyte of garbage per sync shows in a small node's RSS.
const (
	pageSize      = 1 << 20
	firstPageSize = 4 << 10
)

// Netlink message header flags (linux/netlink.h).
const (
	nlmRequest = unix.NLM_F_REQUEST
	nlmAck     = unix.NLM_F_ACK
	nlmCreate  = unix.NLM_F_CREATE
	nlmAppend  = unix.NLM_F_APPEND
)

// Batch accumulates the messages of one transaction, encoded.
type Batch struct {
	fam     nft.Family
	table   string
	pages   [][]byte // whole netlink messages, back to back
	msgs    int
	bytes   int
	last    msgRef // the last message: it asks for the acknowledgement
	setID   uint32 // last NFTA_SET_ID handed out (the kernel requires one per new set)
	w       []byte // the page being written (pages[len(pages)-1] while a message is open)
	msgOff  int    // offset in w of the open message
	scratch []byte
}

type msgRef struct{ page, off int }

// NewBatch returns an empty batch for the objects of one table.
func NewBatch(fam nft.Family, table string) *Batch { return &Batch{fam: fam, table: table} }

// SetTable makes the next messages about another table of the same family.
func (b *Batch) SetTable(table string) { b.table = table }

// ContinueIDs makes b hand out set IDs after prev's: they must be unique within one
// transaction.
func (b *Batch) ContinueIDs(prev *Batch) { b.setID = prev.setID }

// Msgs is the number of messages in the batch.
func (b *Batch) Msgs() int { return b.msgs }

// Bytes is the size of the batch's messages.
func (b *Batch) Bytes() int { return b.bytes }

// Merge returns one batch with the messages of bs, in order (one transaction).
func Merge(bs ...*Batch) *Batch {
	if len(bs) == 1 {
		return bs[0]
	}
	out := &Batch{}
	for _, b := range bs {
		out.Append(b)
	}
	return out
}

// Append moves o's messages to the end of b; o must not be written to after.
func (b *Batch) Append(o *Batch) {
	if o.msgs == 0 {
		return
	}
	b.last = msgRef{len(b.pages) + o.last.page, o.last.off}
	b.pages = append(b.pages, o.pages...)
	b.msgs += o.msgs
	b.bytes += o.bytes
	b.w = nil // the next message starts a page of its own
}

// seq numbers messages uniquely within the process; the kernel quotes it in errors.
var seq atomic.Uint32

// begin opens a message: the netlink header (its length filled by finish) and nfgenmsg.
func (b *Batch) begin(typ uint16, flags uint16) {
	// finish and abandon keep the last page up to date, so a full one is left as it is;
	// b.w is nil before the first message and after Append
	if b.w == nil || len(b.w) >= pageSize {
		size := firstPageSize
		if len(b.pages) > 0 {
			size = pageSize + pageSize/4
		}
		b.w = make([]byte, 0, size)
		b.pages = append(b.pages, b.w)
	}
	b.msgOff = len(b.w)
	b.w = binary.NativeEndian.AppendUint32(b.w, 0) // nlmsg_len
	b.w = binary.NativeEndian.AppendUint16(b.w, unix.NFNL_SUBSYS_NFTABLES<<8|typ)
	b.w = binary.NativeEndian.AppendUint16(b.w, nlmRequest|flags)
	b.w = binary.NativeEndian.AppendUint32(b.w, seq.Add(1))
	b.w = binary.NativeEndian.AppendUint32(b.w, 0) // port: the kernel's
	b.w = append(b.w, byte(b.fam), unix.NFNETLINK_V0, 0, 0)
}

// reserve makes room for n more bytes in the page being written, up to a page's size
// (begin starts the next page when this one is full).
func (b *Batch) reserve(n int) {
	if b.w == nil || cap(b.w)-len(b.w) >= n || len(b.w) >= pageSize {
		return
	}
	w := make([]byte, len(b.w), min(len(b.w)+n, pageSize+pageSize/4))
	copy(w, b.w)
	b.w = w
	b.pages[len(b.pages)-1] = w
}

// finish closes the open message.
func (b *Batch) finish() {
	n := len(b.w) - b.msgOff
	binary.NativeEndian.PutUint32(b.w[b.msgOff:], uint32(n))
	b.pages[len(b.pages)-1] = b.w
	b.last = msgRef{len(b.pages) - 1, b.msgOff}
	b.msgs++
	b.bytes += n
}

// abandon drops the open message (its encoding failed).
func (b *Batch) abandon() {
	b.w = b.w[:b.msgOff]
	b.pages[len(b.pages)-1] = b.w
}

// Attribute encoding, as netlink wants it: a 4-byte header in host byte order (length
// without padding, type), the payload, zeros up to a multiple of 4. Integer payloads
// of nf_tables are big endian.

func (b *Batch) attr(typ uint16, data []byte) {
	b.w = binary.NativeEndian.AppendUint16(b.w, uint16(4+len(data)))
	b.w = binary.NativeEndian.AppendUint16(b.w, typ)
	b.w = append(b.w, data...)
	b.pad()
}

func (b *Batch) pad() {
	for len(b.w)%4 != 0 {
		b.w = append(b.w, 0)
	}
}

func (b *Batch) str(typ uint16, s string) {
	b.w = binary.NativeEndian.AppendUint16(b.w, uint16(4+len(s)+1))
	b.w = binary.NativeEndian.AppendUint16(b.w, typ)
	b.w = append(b.w, s...)
	b.w = append(b.w, 0)
	b.pad()
}

func (b *Batch) u32(typ uint16, v uint32) {
	b.w = binary.NativeEndian.AppendUint16(b.w, 8)
	b.w = binary.NativeEndian.AppendUint16(b.w, typ)
	b.w = binary.BigEndian.AppendUint32(b.w, v)
}

func (b *Batch) u64(typ uint16, v uint64) {
	b.w = binary.NativeEndian.AppendUint16(b.w, 12)
	b.w = binary.NativeEndian.AppendUint16(b.w, typ)
	b.w = binary.BigEndian.AppendUint64(b.w, v)
}

// open starts an attribute whose length close fills in: a nested one (flag set) or
// one whose payload is appended directly.
func (b *Batch) open(typ uint16) int {
	off := len(b.w)
	b.w = binary.NativeEndian.AppendUint16(b.w, 0)
	b.w = binary.NativeEndian.AppendUint16(b.w, typ)
	return off
}

func (b *Batch) nest(typ uint16) int { return b.open(typ | unix.NLA_F_NESTED) }

func (b *Batch) close(off int) {
	binary.NativeEndian.PutUint16(b.w[off:], uint16(len(b.w)-off))
	b.pad()
}

// AddTable creates the table if it does not exist.
func (b *Batch) AddTable() {
	b.begin(unix.NFT_MSG_NEWTABLE, nlmCreate)
	b.str(unix.NFTA_TABLE_NAME, b.table)
	b.u32(unix.NFTA_TABLE_FLAGS, 0)
	b.finish()
}

// DelTable deletes the table.
func (b *Batch) DelTable() {
	b.begin(unix.NFT_MSG_DELTABLE, 0)
	b.str(unix.NFTA_TABLE_NAME, b.table)
	b.finish()
}

// AddChain creates a chain (without its rules).
func (b *Batch) AddChain(c *nft.Chain) {
	b.begin(unix.NFT_MSG_NEWCHAIN, nlmCreate)
	b.str(unix.NFTA_CHAIN_TABLE, b.table)
	b.str(unix.NFTA_CHAIN_NAME, c.Name)
	if h := c.Hook; h != nil {
		n := b.nest(unix.NFTA_CHAIN_HOOK)
		b.u32(unix.NFTA_HOOK_HOOKNUM, uint32(h.Hook))
		b.u32(unix.NFTA_HOOK_PRIORITY, uint32(h.Priority))
		b.close(n)
		b.u32(unix.NFTA_CHAIN_POLICY, nfAccept)
		b.str(unix.NFTA_CHAIN_TYPE, string(h.Type))
	}
	b.finish()
}

// named is a message that only names an object of the table: the table attribute, then
// the object's name (chain, set).
func (b *Batch) named(typ, tableAttr, nameAttr uint16, name string) {
	b.begin(typ, 0)
	b.str(tableAttr, b.table)
	b.str(nameAttr, name)
	b.finish()
}

// FlushChain deletes every rule of a chain.
func (b *Batch) FlushChain(name string) {
	b.named(unix.NFT_MSG_DELRULE, unix.NFTA_RULE_TABLE, unix.NFTA_RULE_CHAIN, name)
}

// DelChain deletes an empty chain.
func (b *Batch) DelChain(name string) {
	b.named(unix.NFT_MSG_DELCHAIN, unix.NFTA_CHAIN_TABLE, unix.NFTA_CHAIN_NAME, name)
}

// AddRule appends a rule to a chain.
func (b *Batch) AddRule(chain string, r nft.Rule) error {
	b.begin(unix.NFT_MSG_NEWRULE, nlmCreate|nlmAppend)
	b.str(unix.NFTA_RULE_TABLE, b.table)
	b.str(unix.NFTA_RULE_CHAIN, chain)
	list := b.nest(unix.NFTA_RULE_EXPRESSIONS)
	for _, s := range r.Stmts {
		if err := b.stmt(b.fam, s); err != nil {
			b.abandon()
			return fmt.Errorf("chain %s: %w", chain, err)
		}
	}
	b.close(list)
	if r.Comment != "" {
		b.scratch = udataString(b.scratch[:0], udataComment, r.Comment)
		b.attr(unix.NFTA_RULE_USERDATA, b.scratch)
	}
	b.finish()
	return nil
}

// AddSet creates a set or map (without its elements).
func (b *Batch) AddSet(s *nft.Set) {
	keyType, keyLen := concatType(s.Key)
	b.setID++
	b.begin(unix.NFT_MSG_NEWSET, nlmCreate)
	b.str(unix.NFTA_SET_TABLE, b.table)
	b.str(unix.NFTA_SET_NAME, s.Name)
	var flags uint32
	if s.IsMap() {
		flags |= unix.NFT_SET_MAP
	}
	if s.Timeout > 0 {
		flags |= unix.NFT_SET_TIMEOUT
	}
	if s.Dynamic {
		flags |= unix.NFT_SET_EVAL
	}
	if s.Interval {
		flags |= unix.NFT_SET_INTERVAL
	}
	b.u32(unix.NFTA_SET_FLAGS, flags)
	b.u32(unix.NFTA_SET_KEY_TYPE, keyType)
	b.u32(unix.NFTA_SET_KEY_LEN, keyLen)
	switch {
	case len(s.Data) == 1 && s.Data[0] == nft.TypeVerdict:
		b.u32(unix.NFTA_SET_DATA_TYPE, unix.NFT_DATA_VERDICT)
		b.u32(unix.NFTA_SET_DATA_LEN, 0)
	case s.IsMap():
		dt, dl := concatType(s.Data)
		b.u32(unix.NFTA_SET_DATA_TYPE, dt)
		b.u32(unix.NFTA_SET_DATA_LEN, dl)
	}
	b.u32(unix.NFTA_SET_ID, b.setID)
	if s.Size > 0 {
		n := b.nest(unix.NFTA_SET_DESC)
		b.u32(unix.NFTA_SET_DESC_SIZE, s.Size)
		b.close(n)
	}
	if s.Timeout > 0 {
		b.u64(unix.NFTA_SET_TIMEOUT, uint64(s.Timeout)*1000)
	}
	b.attr(unix.NFTA_SET_USERDATA, setUserdata(b.fam, s))
	if s.Counter {
		b.counterExpr(nftaSetExpr)
	}
	b.finish()
}

// DelSet deletes a set no rule refers to.
func (b *Batch) DelSet(name string) {
	b.named(unix.NFT_MSG_DELSET, unix.NFTA_SET_TABLE, unix.NFTA_SET_NAME, name)
}

// Elems adds (del == false) or deletes elements, in chunks.
func (b *Batch) Elems(s *nft.Set, es []*nft.Element, del bool) error {
	return b.ElemsOf(s, len(es), func(i int) *nft.Element { return es[i] }, del)
}

// ElemsOf adds (del == false) or deletes n elements, in chunks: element(i) is the i-th,
// which need only stay valid until the next call (it may be built in one buffer).
func (b *Batch) ElemsOf(s *nft.Set, n int, element func(i int) *nft.Element, del bool) error {
	w := b.Stream(s, del)
	for i := range n {
		if err := w.Add(element(i)); err != nil {
			return err
		}
	}
	w.Close()
	return nil
}

// ElemWriter adds or deletes the elements of one set as they come, in messages of at
// most elemChunk elements. After an error the batch lacks that message's elements:
// it is not to be sent.
type ElemWriter struct {
	b      *Batch
	s      *nft.Set
	del    bool
	n      int // elements in the open message (0: none open)
	list   int // its element list's attribute
	header int // the bytes of the last message's header, up to its element list
	expect int // elements still expected after the first (Expect), until room is made
}

// Stream starts adding (del == false) or deleting elements of s; Close ends the last
// message. No other message may be written to b in between.
func (b *Batch) Stream(s *nft.Set, del bool) *ElemWriter { return &ElemWriter{b: b, s: s, del: del} }

// Expect says that about n elements are coming. Once the first is encoded, the page
// being written gets room for all of them at its size (up to a page), rather than
// growing by doubling from a few kilobytes: a full write's sets are megabytes.
func (w *ElemWriter) Expect(n int) { w.expect = n }

// Add encodes e, which need only stay valid during the call.
func (w *ElemWriter) Add(e *nft.Element) error {
	b := w.b
	if w.n == elemChunk {
		w.Close()
	}
	if w.n == 0 {
		typ, flags := uint16(unix.NFT_MSG_NEWSETELEM), uint16(nlmCreate)
		if w.del {
			typ, flags = unix.NFT_MSG_DELSETELEM, 0
		}
		b.begin(typ, flags)
		b.str(unix.NFTA_SET_ELEM_LIST_TABLE, b.table)
		b.str(unix.NFTA_SET_ELEM_LIST_SET, w.s.Name)
		w.list = b.nest(unix.NFTA_SET_ELEM_LIST_ELEMENTS)
		w.header = len(b.w) - b.msgOff
	}
	start := len(b.w)
	if err := b.element(w.s, e, w.del); err != nil {
		b.abandon()
		w.n = 0
		return fmt.Errorf("set %s: element %s: %w", w.s.Name, nft.RenderElementKey(w.s, *e), err)
	}
	w.n++
	if w.expect > 1 {
		rest := w.expect - 1
		b.reserve(rest*(len(b.w)-start) + (rest/elemChunk+1)*w.header)
		w.expect = 0
	}
	return nil
}

// Close ends the open message, if any.
func (w *ElemWriter) Close() {
	if w.n > 0 {
		w.b.close(w.list)
		w.b.finish()
		w.n = 0
	}
}

// element encodes one list element: its key, and unless keyOnly its value, comment and
// counter. A range of an interval set is two kernel elements: its first address, and
// the address after its last, flagged as the interval's end (none when the range ends
// at the family's last address), as nft sends them.
func (b *Batch) element(s *nft.Set, e *nft.Element, keyOnly bool) error {
	if s.Interval {
		return b.interval(s, e, keyOnly)
	}
	el := b.nest(unix.NFTA_LIST_ELEM)
	if err := b.data(unix.NFTA_SET_ELEM_KEY, s.Key, e.Key); err != nil {
		return err
	}
	if !keyOnly {
		switch {
		case e.Verdict != nil:
			code, chain, err := verdictCode(*e.Verdict)
			if err != nil {
				return err
			}
			d := b.nest(unix.NFTA_SET_ELEM_DATA)
			vd := b.nest(unix.NFTA_DATA_VERDICT)
			b.u32(unix.NFTA_VERDICT_CODE, code)
			if chain != "" {
				b.str(unix.NFTA_VERDICT_CHAIN, chain)
			}
			b.close(vd)
			b.close(d)
		case s.IsMap():
			if err := b.data(unix.NFTA_SET_ELEM_DATA, s.Data, e.Data); err != nil {
				return err
			}
		}
		if e.Comment != "" {
			b.scratch = udataString(b.scratch[:0], udataComment, e.Comment)
			b.attr(unix.NFTA_SET_ELEM_USERDATA, b.scratch)
		}
		if s.Counter {
			b.counterExpr(nftaSetElemExpr)
		}
	}
	b.close(el)
	return nil
}

func (b *Batch) interval(s *nft.Set, e *nft.Element, keyOnly bool) error {
	if len(e.Key) != 1 || len(e.Data) != 1 {
		return fmt.Errorf("a range needs a first and a last address")
	}
	first, last := e.Key[0].Addr(), e.Data[0].Addr()
	if !first.IsValid() || !last.IsValid() || first.Is4() != last.Is4() || last.Less(first) {
		return fmt.Errorf("range %s-%s is not one", first, last)
	}
	el := b.nest(unix.NFTA_LIST_ELEM)
	if err := b.data(unix.NFTA_SET_ELEM_KEY, s.Key, e.Key); err != nil {
		return err
	}
	if !keyOnly && e.Comment != "" {
		b.scratch = udataString(b.scratch[:0], udataComment, e.Comment)
		b.attr(unix.NFTA_SET_ELEM_USERDATA, b.scratch)
	}
	b.close(el)
	if end := last.Next(); end.IsValid() {
		el := b.nest(unix.NFTA_LIST_ELEM)
		if err := b.data(unix.NFTA_SET_ELEM_KEY, s.Key, []nft.Value{nft.Addr(end)}); err != nil {
			return err
		}
		b.u32(unix.NFTA_SET_ELEM_FLAGS, unix.NFT_SET_ELEM_INTERVAL_END)
		b.close(el)
	}
	return nil
}

// data encodes a key or map value: attribute typ holding an NFTA_DATA_VALUE.
func (b *Batch) data(typ uint16, ts []nft.Datatype, vs []nft.Value) error {
	n := b.nest(typ)
	v := b.open(unix.NFTA_DATA_VALUE)
	var err error
	if b.w, err = AppendValues(b.w, ts, vs); err != nil {
		return err
	}
	b.close(v)
	b.close(n)
	return nil
}

// Attributes golang.org/x/sys/unix does not name.
const (
	nftaSetExpr     = 17 // NFTA_SET_EXPR
	nftaSetElemExpr = 7  // NFTA_SET_ELEM_EXPR
)

// counterExpr encodes a zeroed counter expression, as nft attaches to counter sets.
func (b *Batch) counterExpr(typ uint16) {
	n := b.nest(typ)
	b.str(unix.NFTA_EXPR_NAME, "counter")
	b.close(b.nest(unix.NFTA_EXPR_DATA))
	b.close(n)
}

// FlushSet deletes every element of a set (dynamic sets' learned entries).
func (b *Batch) FlushSet(name string) {
	b.named(unix.NFT_MSG_DELSETELEM, unix.NFTA_SET_ELEM_LIST_TABLE, unix.NFTA_SET_ELEM_LIST_SET, name)
}

// each calls fn with the type (NFT_MSG_*) and payload (after nfgenmsg) of every message.
func (b *Batch) each(fn func(typ uint16, payload []byte) error) error {
	for _, p := range b.pages {
		for len(p) >= 20 {
			n := int(binary.NativeEndian.Uint32(p))
			if err := fn(binary.NativeEndian.Uint16(p[4:])&0xff, p[20:n]); err != nil {
				return err
			}
			p = p[n:]
		}
	}
	return nil
}

// Verdict codes (linux/netfilter.h, nf_tables.h): negative values as two's complement.
const (
	nfDrop        uint32 = 0
	nfAccept      uint32 = 1
	verdictJump   uint32 = 0xfffffffd // NFT_JUMP  (-3)
	verdictGoto   uint32 = 0xfffffffc // NFT_GOTO  (-4)
	verdictReturn uint32 = 0xfffffffb // NFT_RETURN (-5)
)

func verdictCode(v nft.Verdict) (uint32, string, error) {
	switch v.Kind {
	case nft.Accept:
		return nfAccept, "", nil
	case nft.Drop:
		return nfDrop, "", nil
	case nft.Return:
		return verdictReturn, "", nil
	case nft.Jump:
		return verdictJump, v.Chain, nil
	case nft.Goto:
		return verdictGoto, v.Chain, nil
	}
	return 0, "", fmt.Errorf("unknown verdict kind %d", v.Kind)
}

// Send submits the batch as one transaction. The kernel applies all of it or, on any
// error, none of it. Only the last message asks for an acknowledgement: the kernel
// answers a failing message whether asked or not, and one ack per message would overflow
// the socket's receive buffer for large batches (ENOBUFS).
func (b *Batch) Send(c *netlink.Conn) error {
	if b.msgs == 0 {
		return nil
	}
	// the last message asks for the acknowledgement
	lastHdr := b.pages[b.last.page][b.last.off:]
	binary.NativeEndian.PutUint16(lastHdr[6:], binary.NativeEndian.Uint16(lastHdr[6:])|nlmAck)
	lastSeq := binary.NativeEndian.Uint32(lastHdr[8:])
	iov := make([][]byte, 0, len(b.pages)+2)
	iov = append(iov, batchMsg(unix.NFNL_MSG_BATCH_BEGIN))
	iov = append(iov, b.pages...)
	iov = append(iov, batchMsg(unix.NFNL_MSG_BATCH_END))
	if err := sizeBuffers(c, b.bytes); err != nil {
		return err
	}
	if err := sendIOV(c, iov); err != nil {
		return fmt.Errorf("sending batch of %d messages (%d bytes): %w", b.msgs+2, b.bytes, err)
	}
	if err := c.SetReadDeadline(time.Now().Add(ackTimeout)); err != nil {
		return err
	}
	var errs []error
	for {
		replies, err := c.Receive()
		switch {
		case err == nil:
			for _, r := range replies {
				if r.Header.Sequence == lastSeq {
					return b.failure(errs)
				}
			}
		case errors.Is(err, os.ErrDeadlineExceeded) && len(errs) > 0:
			return b.failure(errs) // all errors of a failed batch have arrived
		case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, syscall.ENOBUFS), errors.Is(err, os.ErrPermission):
			return fmt.Errorf("transaction of %d messages (%d bytes): %w", b.msgs, b.bytes, errors.Join(append(errs, err)...))
		default:
			// An error for some message: the batch failed. Collect the rest of the
			// errors (they arrive together) without waiting for the full timeout.
			if len(errs) < 5 {
				errs = append(errs, err)
			}
			if err := c.SetReadDeadline(time.Now().Add(200 * time.Millisecond)); err != nil {
				return err
			}
		}
	}
}

// batchMsg is NFNL_MSG_BATCH_BEGIN or _END for the nf_tables subsystem.
func batchMsg(typ uint16) []byte {
	m := make([]byte, 0, 20)
	m = binary.NativeEndian.AppendUint32(m, 20)
	m = binary.NativeEndian.AppendUint16(m, typ)
	m = binary.NativeEndian.AppendUint16(m, nlmRequest)
	m = binary.NativeEndian.AppendUint32(m, seq.Add(1))
	m = binary.NativeEndian.AppendUint32(m, 0)
	return append(m, 0, unix.NFNETLINK_V0, 0, unix.NFNL_SUBSYS_NFTABLES)
}

// sendIOV sends the buffers as one datagram: the kernel reads a batch from one sendmsg.
func sendIOV(c *netlink.Conn, iov [][]byte) error {
	if p := peerOf(c); p != nil {
		var datagram []byte
		for _, v := range iov {
			datagram = append(datagram, v...)
		}
		return p.transaction(datagram)
	}
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	total := 0
	for _, v := range iov {
		total += len(v)
	}
	var n int
	var serr error
	if err := raw.Write(func(fd uintptr) bool {
		n, serr = unix.SendmsgBuffers(int(fd), iov, nil, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}, 0)
		return serr != unix.EAGAIN
	}); err != nil {
		return err
	}
	if serr != nil {
		return serr
	}
	if n != total {
		return fmt.Errorf("short send: %d of %d bytes", n, total)
	}
	return nil
}

func (b *Batch) failure(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	return &RejectedError{Messages: b.msgs, Err: errors.Join(errs...)}
}

// RejectedError is the kernel's refusal of a transaction: it applied none of it, so the
// table is exactly as before.
type RejectedError struct {
	Messages int   // in the transaction
	Err      error // the kernel's errors (up to five)
}

func (e *RejectedError) Error() string {
	return fmt.Sprintf("kernel refused the transaction of %d messages: %v", e.Messages, e.Err)
}

func (e *RejectedError) Unwrap() error { return e.Err }

const ackTimeout = 60 * time.Second

// sizeBuffers makes the socket's send buffer large enough for the whole batch (a batch
// must travel in one sendmsg) and the receive buffer large enough for the acks.
func sizeBuffers(c *netlink.Conn, bytes int) error {
	want := bytes + 1<<20
	if peerOf(c) != nil {
		return nil
	}
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, want)
		if serr == nil {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4<<20)
		}
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("sizing netlink socket buffers for %d bytes: %w", want, serr)
	}
	return nil
}
