package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft"
)

// An in-process peer in place of the kernel: DialPeer returns a connection on which
// everything nftproxy sends (transactions, GETGEN, the dumps of tables, chains and
// sets) goes to a Peer instead of a netlink socket. The connection carries the same
// netlink messages a socket would, and answers as the kernel does (an error per refused
// message, an acknowledgement of the last, dumps closed by NLMSG_DONE), so that what
// talks to it (nft/kernel's Applier) runs as it does against the kernel. nft/fake is
// such a peer: an nf_tables in memory, with the kernel's commit semantics.

// Peer answers nf_tables requests in place of the kernel.
type Peer interface {
	// Transaction gets the messages of one batch, parsed, and commits all of them or
	// none: it returns nil when it committed, else the errors of the messages it
	// refused (the kernel's errno in each, wrapped).
	Transaction(msgs []Msg) []MsgError
	// Tables returns the tables of a family as they are now, for dumps. They are read
	// only, and must not change afterwards (a commit replaces what it changes).
	Tables(fam nft.Family) []*TableState
	// Generation is the ruleset generation (NFT_MSG_GETGEN).
	Generation() uint32
}

// Msg is one message of a transaction, parsed: its type (unix.NFT_MSG_*), family and
// table, and what it adds or deletes.
type Msg struct {
	Type   uint16
	Family nft.Family
	Table  string
	// Name is the chain (NEWCHAIN, DELCHAIN, DELRULE: flush; NEWRULE: the rule's) or
	// set (NEWSET, DELSET, NEWSETELEM, DELSETELEM) the message is about.
	Name  string
	Chain *ChainState // NEWCHAIN
	Rule  *RuleState  // NEWRULE
	Set   *SetState   // NEWSET
	Elems []ElemState // NEWSETELEM, DELSETELEM (none: flush the set)
	// Flowtable is the flowtable of NEWFLOWTABLE (Name: also of DELFLOWTABLE).
	Flowtable *FlowtableState
}

// MsgError is a refused message of a transaction: its index in the messages given to
// Transaction and the error (wrapping a syscall.Errno).
type MsgError struct {
	Index int
	Err   error
}

// ParseMsg parses the payload (after nfgenmsg) of an nf_tables message of type typ
// (unix.NFT_MSG_*).
func ParseMsg(typ uint16, fam nft.Family, payload []byte) (Msg, error) {
	m := Msg{Type: typ, Family: fam}
	var err error
	switch typ {
	case unix.NFT_MSG_NEWTABLE, unix.NFT_MSG_DELTABLE:
		m.Table = stringAttr(payload, unix.NFTA_TABLE_NAME)
	case unix.NFT_MSG_NEWCHAIN:
		m.Table, m.Chain, err = parseChain(payload)
		if m.Chain != nil {
			m.Name = m.Chain.Name
		}
	case unix.NFT_MSG_DELCHAIN:
		m.Table, m.Name = stringAttr(payload, unix.NFTA_CHAIN_TABLE), stringAttr(payload, unix.NFTA_CHAIN_NAME)
	case unix.NFT_MSG_NEWRULE:
		var r RuleState
		m.Table, m.Name, r, err = parseRule(payload)
		m.Rule = &r
	case unix.NFT_MSG_DELRULE:
		m.Table, m.Name = stringAttr(payload, unix.NFTA_RULE_TABLE), stringAttr(payload, unix.NFTA_RULE_CHAIN)
	case unix.NFT_MSG_NEWSET:
		m.Table, m.Set, err = parseSet(payload)
		if m.Set != nil {
			m.Name = m.Set.Name
		}
	case unix.NFT_MSG_DELSET:
		m.Table, m.Name = stringAttr(payload, unix.NFTA_SET_TABLE), stringAttr(payload, unix.NFTA_SET_NAME)
	case unix.NFT_MSG_NEWSETELEM, unix.NFT_MSG_DELSETELEM:
		m.Table, m.Name, m.Elems, err = parseElems(payload)
	case unix.NFT_MSG_NEWFLOWTABLE, unix.NFT_MSG_DELFLOWTABLE:
		m.Table, m.Flowtable, err = parseFlowtable(payload)
		if m.Flowtable != nil {
			m.Name = m.Flowtable.Name
		}
	default:
		err = fmt.Errorf("message type %d: %w", typ, syscall.EOPNOTSUPP)
	}
	return m, err
}

// SetRef is a rule's use of a set.
type SetRef struct {
	Set string
	// Verdicts: a verdict map (vmap); Values: a map of values (dnat … map); Update:
	// the rule adds to it (a dynamic set); none: a lookup.
	Verdicts, Values, Update bool
}

// RuleRefs returns the chains a rule jumps or goes to and the sets it uses.
func RuleRefs(r RuleState) (chains []string, sets []SetRef) {
	chains, sets, _ = RuleRefsAll(r)
	return chains, sets
}

// RuleRefsAll is RuleRefs with the flowtables the rule adds flows to.
func RuleRefsAll(r RuleState) (chains []string, sets []SetRef, flowtables []string) {
	for _, e := range r.Exprs {
		switch e.Name {
		case "flow_offload":
			flowtables = append(flowtables, cstring(e.Attrs[nftaFlowTableName]))
		case "immediate":
			if d, ok := e.Attrs[unix.NFTA_IMMEDIATE_DATA]; ok {
				if v := immediateVerdictState(d); v.VerdictChain != "" {
					chains = append(chains, v.VerdictChain)
				}
			}
		case "lookup":
			ref := SetRef{Set: cstring(e.Attrs[unix.NFTA_LOOKUP_SET])}
			if d, ok := e.Attrs[unix.NFTA_LOOKUP_DREG]; ok {
				if be32(d) == 0 { // NFT_REG_VERDICT
					ref.Verdicts = true
				} else {
					ref.Values = true
				}
			}
			sets = append(sets, ref)
		case "dynset":
			sets = append(sets, SetRef{Set: cstring(e.Attrs[unix.NFTA_DYNSET_SET_NAME]), Update: true})
		}
	}
	return chains, sets, flowtables
}

func immediateVerdictState(data []byte) ElemState {
	ad, err := decoder(data)
	if err != nil {
		return ElemState{}
	}
	for ad.Next() {
		if ad.Type() == unix.NFTA_DATA_VERDICT {
			return decodeVerdict(ad.Bytes())
		}
	}
	return ElemState{}
}

// SameSetDef reports whether two sets have the same definition (their elements aside).
func SameSetDef(a, b *SetState) bool {
	return a.Flags == b.Flags && a.KeyType == b.KeyType && a.KeyLen == b.KeyLen && a.DataType == b.DataType &&
		a.DataLen == b.DataLen && a.Timeout == b.Timeout && a.Size == b.Size && string(a.UserData) == string(b.UserData) &&
		fmt.Sprint(a.Exprs) == fmt.Sprint(b.Exprs)
}

// peerPort hands out the port ids of peer connections: above the range the kernel
// gives sockets of this process, so that no two connections share one.
var peerPort atomic.Uint32

// peers are the open peer connections, by the Conn they are the socket of.
var peers sync.Map // *netlink.Conn → *peerSocket

// DialPeer returns a connection whose other end is p instead of the kernel.
func DialPeer(p Peer) *netlink.Conn {
	s := &peerSocket{p: p, port: 1<<31 | peerPort.Add(1)}
	c := netlink.NewConn(s, s.port)
	s.conn = c
	peers.Store(c, s)
	return c
}

// peerOf returns the peer socket of c, nil if c is a netlink socket.
func peerOf(c *netlink.Conn) *peerSocket {
	if s, ok := peers.Load(c); ok {
		return s.(*peerSocket)
	}
	return nil
}

// peerSocket is a netlink.Socket whose datagrams go to a Peer. Its answers are queued,
// one Receive each; Receive on an empty queue fails as a read past its deadline does.
type peerSocket struct {
	p    Peer
	port uint32
	conn *netlink.Conn

	mu    sync.Mutex
	queue [][]netlink.Message
}

func (s *peerSocket) Close() error { peers.Delete(s.conn); return nil }

func (s *peerSocket) Send(m netlink.Message) error { return s.SendMessages([]netlink.Message{m}) }

// SendMessages handles one request (GETGEN, a dump) per message.
func (s *peerSocket) SendMessages(ms []netlink.Message) error {
	for _, m := range ms {
		s.request(m)
	}
	return nil
}

func (s *peerSocket) Receive() ([]netlink.Message, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.queue) == 0 {
		return nil, os.ErrDeadlineExceeded
	}
	out := s.queue[0]
	s.queue = s.queue[1:]
	return out, nil
}

func (s *peerSocket) SetDeadline(time.Time) error      { return nil }
func (s *peerSocket) SetReadDeadline(time.Time) error  { return nil }
func (s *peerSocket) SetWriteDeadline(time.Time) error { return nil }

func (s *peerSocket) answer(ms ...netlink.Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queue = append(s.queue, ms)
}

// errorMsg is the kernel's NLMSG_ERROR answer to req: an acknowledgement when err is
// nil, else its errno with the error's text as the extended acknowledgement's message.
func (s *peerSocket) errorMsg(req netlink.Header, err error) netlink.Message {
	m := netlink.Message{Header: netlink.Header{Type: netlink.Error, Sequence: req.Sequence, PID: s.port}}
	var errno syscall.Errno
	if err != nil && !errors.As(err, &errno) {
		errno = syscall.EINVAL
	}
	data := binary.NativeEndian.AppendUint32(nil, uint32(-int32(errno)))
	// the request's header, capped (its payload left out): 16 bytes
	data = binary.NativeEndian.AppendUint32(data, 16)
	data = binary.NativeEndian.AppendUint16(data, uint16(req.Type))
	data = binary.NativeEndian.AppendUint16(data, uint16(req.Flags))
	data = binary.NativeEndian.AppendUint32(data, req.Sequence)
	data = binary.NativeEndian.AppendUint32(data, req.PID)
	if err != nil {
		m.Header.Flags = netlink.Capped | netlink.AcknowledgeTLVs
		ae := netlink.NewAttributeEncoder()
		ae.String(unix.NLMSGERR_ATTR_MSG, err.Error())
		tlvs, _ := ae.Encode()
		data = append(data, tlvs...)
	}
	m.Data = data
	return m
}

// transaction handles one datagram of messages, a batch: BATCH_BEGIN, the messages,
// BATCH_END.
func (s *peerSocket) transaction(datagram []byte) error {
	raw, err := syscall.ParseNetlinkMessage(datagram)
	if err != nil {
		return err
	}
	if len(raw) < 2 || raw[0].Header.Type != unix.NFNL_MSG_BATCH_BEGIN || raw[len(raw)-1].Header.Type != unix.NFNL_MSG_BATCH_END {
		return errors.New("peer: a datagram that is not one batch")
	}
	raw = raw[1 : len(raw)-1]
	hdrs := make([]netlink.Header, len(raw))
	msgs := make([]Msg, len(raw))
	var refused []MsgError
	for i, r := range raw {
		h := r.Header
		hdrs[i] = netlink.Header{Length: h.Len, Type: netlink.HeaderType(h.Type), Flags: netlink.HeaderFlags(h.Flags), Sequence: h.Seq, PID: h.Pid}
		if len(r.Data) < 4 || h.Type>>8 != unix.NFNL_SUBSYS_NFTABLES {
			refused = append(refused, MsgError{i, fmt.Errorf("message %d: not nf_tables: %w", i, syscall.EINVAL)})
			continue
		}
		if msgs[i], err = ParseMsg(h.Type&0xff, nft.Family(r.Data[0]), r.Data[4:]); err != nil {
			refused = append(refused, MsgError{i, err})
		}
	}
	if refused == nil {
		refused = s.p.Transaction(msgs)
	}
	errs := map[int]error{}
	for _, e := range refused {
		if errs[e.Index] == nil {
			errs[e.Index] = e.Err
		}
	}
	for i, h := range hdrs {
		if err := errs[i]; err != nil || h.Flags&netlink.Acknowledge != 0 {
			s.answer(s.errorMsg(h, err))
		}
	}
	return nil
}

// request answers one request: GETGEN, or a dump of tables, chains or sets.
func (s *peerSocket) request(m netlink.Message) {
	typ := uint16(m.Header.Type)
	if typ>>8 != unix.NFNL_SUBSYS_NFTABLES || len(m.Data) < 4 {
		s.answer(s.errorMsg(m.Header, syscall.EINVAL))
		return
	}
	fam := nft.Family(m.Data[0])
	reply := func(typ uint16, build func(ae *netlink.AttributeEncoder)) netlink.Message {
		ae := netlink.NewAttributeEncoder()
		ae.ByteOrder = binary.BigEndian
		build(ae)
		data, _ := ae.Encode()
		return netlink.Message{
			Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | typ), Flags: netlink.Multi,
				Sequence: m.Header.Sequence, PID: s.port},
			Data: append([]byte{byte(fam), unix.NFNETLINK_V0, 0, 0}, data...),
		}
	}
	var out []netlink.Message
	switch typ & 0xff {
	case unix.NFT_MSG_GETGEN:
		gen := s.p.Generation()
		msg := reply(unix.NFT_MSG_NEWGEN, func(ae *netlink.AttributeEncoder) { ae.Uint32(unix.NFTA_GEN_ID, gen) })
		msg.Header.Flags = 0
		s.answer(msg)
		return
	case unix.NFT_MSG_GETTABLE:
		for _, t := range s.p.Tables(fam) {
			out = append(out, reply(unix.NFT_MSG_NEWTABLE, func(ae *netlink.AttributeEncoder) { ae.String(unix.NFTA_TABLE_NAME, t.Name) }))
		}
	case unix.NFT_MSG_GETCHAIN:
		for _, t := range s.p.Tables(fam) {
			for _, name := range sortedKeys(t.Chains) {
				out = append(out, reply(unix.NFT_MSG_NEWCHAIN, func(ae *netlink.AttributeEncoder) {
					ae.String(unix.NFTA_CHAIN_TABLE, t.Name)
					ae.String(unix.NFTA_CHAIN_NAME, name)
				}))
			}
		}
	case unix.NFT_MSG_GETSET:
		table := stringAttr(m.Data[4:], unix.NFTA_SET_TABLE)
		for _, t := range s.p.Tables(fam) {
			if table != "" && t.Name != table {
				continue
			}
			for _, name := range sortedKeys(t.Sets) {
				set := t.Sets[name]
				out = append(out, reply(unix.NFT_MSG_NEWSET, func(ae *netlink.AttributeEncoder) {
					ae.String(unix.NFTA_SET_TABLE, t.Name)
					ae.String(unix.NFTA_SET_NAME, name)
					ae.Uint32(unix.NFTA_SET_FLAGS, set.Flags)
					ae.Uint32(unix.NFTA_SET_KEY_TYPE, set.KeyType)
					ae.Uint32(unix.NFTA_SET_KEY_LEN, set.KeyLen)
				}))
			}
		}
	case unix.NFT_MSG_GETFLOWTABLE:
		table := stringAttr(m.Data[4:], nftaFlowtableTable)
		for _, t := range s.p.Tables(fam) {
			if table != "" && t.Name != table {
				continue
			}
			for _, name := range sortedKeys(t.Flowtables) {
				out = append(out, reply(unix.NFT_MSG_NEWFLOWTABLE, func(ae *netlink.AttributeEncoder) {
					ae.String(nftaFlowtableTable, t.Name)
					ae.String(nftaFlowtableName, name)
				}))
			}
		}
	default:
		s.answer(s.errorMsg(m.Header, syscall.EOPNOTSUPP))
		return
	}
	done := netlink.Message{Header: netlink.Header{Type: netlink.Done, Flags: netlink.Multi, Sequence: m.Header.Sequence, PID: s.port},
		Data: make([]byte, 4)}
	s.answer(append(out, done)...)
}
