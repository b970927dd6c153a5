// Package kernel is the only code in nftproxy that talks to the kernel about nftables.
// It encodes nft.Ruleset values into nf_tables netlink messages (expressions through
// github.com/google/nftables/expr) and applies each sync as ONE netlink batch: the kernel
// commits it atomically or not at all.
package kernel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft"
)

// elemChunk bounds the elements per NEWSETELEM message, so that no single netlink
// attribute overflows its 16-bit length.
const elemChunk = 512

// batch accumulates the messages of one transaction.
type batch struct {
	fam   nft.Family
	table string
	msgs  []netlink.Message
	what  []string // per message: a description for error reports
	bytes int
	setID uint32 // last NFTA_SET_ID handed out (the kernel requires one per new set)
}

func newBatch(fam nft.Family, table string) *batch { return &batch{fam: fam, table: table} }

func (b *batch) add(typ uint16, flags netlink.HeaderFlags, what string, build func(ae *netlink.AttributeEncoder)) error {
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian // nf_tables attributes are in network byte order
	build(ae)
	data, err := ae.Encode()
	if err != nil {
		return fmt.Errorf("encoding %s: %w", what, err)
	}
	msg := netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | typ),
			Flags: netlink.Request | flags,
		},
		Data: append([]byte{byte(b.fam), unix.NFNETLINK_V0, 0, 0}, data...),
	}
	b.msgs = append(b.msgs, msg)
	b.what = append(b.what, what)
	b.bytes += len(msg.Data) + 16
	return nil
}

func (b *batch) addTable() error {
	return b.add(unix.NFT_MSG_NEWTABLE, netlink.Create, "table "+b.table, func(ae *netlink.AttributeEncoder) {
		ae.String(unix.NFTA_TABLE_NAME, b.table)
		ae.Uint32(unix.NFTA_TABLE_FLAGS, 0)
	})
}

func (b *batch) delTable() error {
	return b.add(unix.NFT_MSG_DELTABLE, 0, "delete table "+b.table, func(ae *netlink.AttributeEncoder) {
		ae.String(unix.NFTA_TABLE_NAME, b.table)
	})
}

func (b *batch) addChain(c *nft.Chain) error {
	return b.add(unix.NFT_MSG_NEWCHAIN, netlink.Create, "chain "+c.Name, func(ae *netlink.AttributeEncoder) {
		ae.String(unix.NFTA_CHAIN_TABLE, b.table)
		ae.String(unix.NFTA_CHAIN_NAME, c.Name)
		if h := c.Hook; h != nil {
			ae.Nested(unix.NFTA_CHAIN_HOOK, func(nae *netlink.AttributeEncoder) error {
				nae.Uint32(unix.NFTA_HOOK_HOOKNUM, uint32(h.Hook))
				nae.Uint32(unix.NFTA_HOOK_PRIORITY, uint32(h.Priority))
				return nil
			})
			ae.Uint32(unix.NFTA_CHAIN_POLICY, nfAccept)
			ae.String(unix.NFTA_CHAIN_TYPE, string(h.Type))
		}
	})
}

func (b *batch) flushChain(name string) error {
	return b.add(unix.NFT_MSG_DELRULE, 0, "flush chain "+name, func(ae *netlink.AttributeEncoder) {
		ae.String(unix.NFTA_RULE_TABLE, b.table)
		ae.String(unix.NFTA_RULE_CHAIN, name)
	})
}

func (b *batch) delChain(name string) error {
	return b.add(unix.NFT_MSG_DELCHAIN, 0, "delete chain "+name, func(ae *netlink.AttributeEncoder) {
		ae.String(unix.NFTA_CHAIN_TABLE, b.table)
		ae.String(unix.NFTA_CHAIN_NAME, name)
	})
}

func (b *batch) addRule(chain string, r nft.Rule) error {
	es, err := exprs(b.fam, r)
	if err != nil {
		return fmt.Errorf("chain %s: %w", chain, err)
	}
	encoded := make([][]byte, len(es))
	for i, e := range es {
		if encoded[i], err = expr.Marshal(byte(b.fam), e); err != nil {
			return fmt.Errorf("chain %s: encoding %T: %w", chain, e, err)
		}
	}
	what := "rule in chain " + chain
	if r.Comment != "" {
		what += " (" + r.Comment + ")"
	}
	return b.add(unix.NFT_MSG_NEWRULE, netlink.Create|netlink.Append, what, func(ae *netlink.AttributeEncoder) {
		ae.String(unix.NFTA_RULE_TABLE, b.table)
		ae.String(unix.NFTA_RULE_CHAIN, chain)
		ae.Nested(unix.NFTA_RULE_EXPRESSIONS, func(nae *netlink.AttributeEncoder) error {
			for _, e := range encoded {
				nae.Bytes(unix.NLA_F_NESTED|unix.NFTA_LIST_ELEM, e)
			}
			return nil
		})
		if r.Comment != "" {
			ae.Bytes(unix.NFTA_RULE_USERDATA, udataString(nil, udataComment, r.Comment))
		}
	})
}

func (b *batch) addSet(s *nft.Set) error {
	keyType, keyLen := concatType(s.Key)
	b.setID++
	id := b.setID
	return b.add(unix.NFT_MSG_NEWSET, netlink.Create, "set "+s.Name, func(ae *netlink.AttributeEncoder) {
		ae.String(unix.NFTA_SET_TABLE, b.table)
		ae.String(unix.NFTA_SET_NAME, s.Name)
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
		ae.Uint32(unix.NFTA_SET_FLAGS, flags)
		ae.Uint32(unix.NFTA_SET_KEY_TYPE, keyType)
		ae.Uint32(unix.NFTA_SET_KEY_LEN, keyLen)
		switch {
		case len(s.Data) == 1 && s.Data[0] == nft.TypeVerdict:
			ae.Uint32(unix.NFTA_SET_DATA_TYPE, unix.NFT_DATA_VERDICT)
			ae.Uint32(unix.NFTA_SET_DATA_LEN, 0)
		case s.IsMap():
			dt, dl := concatType(s.Data)
			ae.Uint32(unix.NFTA_SET_DATA_TYPE, dt)
			ae.Uint32(unix.NFTA_SET_DATA_LEN, dl)
		}
		ae.Uint32(unix.NFTA_SET_ID, id)
		if s.Size > 0 {
			ae.Nested(unix.NFTA_SET_DESC, func(nae *netlink.AttributeEncoder) error {
				nae.Uint32(unix.NFTA_SET_DESC_SIZE, s.Size)
				return nil
			})
		}
		if s.Timeout > 0 {
			ae.Uint64(unix.NFTA_SET_TIMEOUT, uint64(s.Timeout)*1000)
		}
		ae.Bytes(unix.NFTA_SET_USERDATA, setUserdata(b.fam, s))
		if s.Counter {
			ae.Nested(nftaSetExpr, counterExpr)
		}
	})
}

func (b *batch) delSet(name string) error {
	return b.add(unix.NFT_MSG_DELSET, 0, "delete set "+name, func(ae *netlink.AttributeEncoder) {
		ae.String(unix.NFTA_SET_TABLE, b.table)
		ae.String(unix.NFTA_SET_NAME, name)
	})
}

// elems adds (del == false) or deletes elements, in chunks.
func (b *batch) elems(s *nft.Set, es []nft.Element, del bool) error {
	typ, verb := uint16(unix.NFT_MSG_NEWSETELEM), "add"
	flags := netlink.Create
	if del {
		typ, verb, flags = unix.NFT_MSG_DELSETELEM, "delete", 0
	}
	for start := 0; start < len(es); start += elemChunk {
		chunk := es[start:min(start+elemChunk, len(es))]
		encoded := make([][]byte, len(chunk))
		for i, e := range chunk {
			var err error
			if encoded[i], err = encodeElement(s, e, del); err != nil {
				return fmt.Errorf("set %s: element %s: %w", s.Name, nft.RenderElementKey(s, e), err)
			}
		}
		what := fmt.Sprintf("%s %d elements of set %s", verb, len(chunk), s.Name)
		if err := b.add(typ, flags, what, func(ae *netlink.AttributeEncoder) {
			ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, b.table)
			ae.String(unix.NFTA_SET_ELEM_LIST_SET, s.Name)
			ae.Nested(unix.NFTA_SET_ELEM_LIST_ELEMENTS, func(nae *netlink.AttributeEncoder) error {
				for _, e := range encoded {
					nae.Bytes(unix.NLA_F_NESTED|unix.NFTA_LIST_ELEM, e)
				}
				return nil
			})
		}); err != nil {
			return err
		}
	}
	return nil
}

// Attributes golang.org/x/sys/unix does not name.
const (
	nftaSetExpr     = 17 // NFTA_SET_EXPR
	nftaSetElemExpr = 7  // NFTA_SET_ELEM_EXPR
)

// counterExpr encodes a zeroed counter expression, as nft attaches to counter sets.
func counterExpr(ae *netlink.AttributeEncoder) error {
	ae.String(unix.NFTA_EXPR_NAME, "counter")
	ae.Nested(unix.NFTA_EXPR_DATA, func(*netlink.AttributeEncoder) error { return nil })
	return nil
}

// flushSet deletes every element of a set (dynamic sets' learned entries).
func (b *batch) flushSet(name string) error {
	return b.add(unix.NFT_MSG_DELSETELEM, 0, "flush set "+name, func(ae *netlink.AttributeEncoder) {
		ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, b.table)
		ae.String(unix.NFTA_SET_ELEM_LIST_SET, name)
	})
}

func encodeElement(s *nft.Set, e nft.Element, keyOnly bool) ([]byte, error) {
	key, err := encodeValues(s.Key, e.Key)
	if err != nil {
		return nil, err
	}
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian
	ae.Nested(unix.NFTA_SET_ELEM_KEY, func(nae *netlink.AttributeEncoder) error {
		nae.Bytes(unix.NFTA_DATA_VALUE, key)
		return nil
	})
	if !keyOnly {
		switch {
		case e.Verdict != nil:
			code, chain, err := verdictCode(*e.Verdict)
			if err != nil {
				return nil, err
			}
			ae.Nested(unix.NFTA_SET_ELEM_DATA, func(nae *netlink.AttributeEncoder) error {
				nae.Nested(unix.NFTA_DATA_VERDICT, func(vae *netlink.AttributeEncoder) error {
					vae.Uint32(unix.NFTA_VERDICT_CODE, code)
					if chain != "" {
						vae.String(unix.NFTA_VERDICT_CHAIN, chain)
					}
					return nil
				})
				return nil
			})
		case s.IsMap():
			data, err := encodeValues(s.Data, e.Data)
			if err != nil {
				return nil, err
			}
			ae.Nested(unix.NFTA_SET_ELEM_DATA, func(nae *netlink.AttributeEncoder) error {
				nae.Bytes(unix.NFTA_DATA_VALUE, data)
				return nil
			})
		}
		if e.Comment != "" {
			ae.Bytes(unix.NFTA_SET_ELEM_USERDATA, udataString(nil, udataComment, e.Comment))
		}
		if s.Counter {
			ae.Nested(nftaSetElemExpr, counterExpr)
		}
	}
	return ae.Encode()
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

// send submits the batch as one transaction. The kernel applies all of it or, on any
// error, none of it. Only the last message asks for an acknowledgement: the kernel
// answers a failing message whether asked or not, and one ack per message would overflow
// the socket's receive buffer for large batches (ENOBUFS).
func (b *batch) send(c *netlink.Conn) error {
	if len(b.msgs) == 0 {
		return nil
	}
	msgs := make([]netlink.Message, 0, len(b.msgs)+2)
	begin := netlink.Message{Header: netlink.Header{Type: unix.NFNL_MSG_BATCH_BEGIN, Flags: netlink.Request}, Data: []byte{0, unix.NFNETLINK_V0, 0, unix.NFNL_SUBSYS_NFTABLES}}
	end := begin
	end.Header.Type = unix.NFNL_MSG_BATCH_END
	msgs = append(msgs, begin)
	msgs = append(msgs, b.msgs...)
	msgs[len(msgs)-1].Header.Flags |= netlink.Acknowledge
	msgs = append(msgs, end)
	if err := sizeBuffers(c, b.bytes); err != nil {
		return err
	}
	if err := noteOwnTransaction(c); err != nil { // so that a Monitor ignores its events
		return err
	}
	sent, err := c.SendMessages(msgs)
	if err != nil {
		return fmt.Errorf("sending batch of %d messages (%d bytes): %w", len(msgs), b.bytes, err)
	}
	lastSeq := sent[len(sent)-2].Header.Sequence
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
			return fmt.Errorf("transaction of %d messages (%d bytes): %w", len(b.msgs), b.bytes, errors.Join(append(errs, err)...))
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

func (b *batch) failure(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	return &RejectedError{Messages: len(b.msgs), Err: errors.Join(errs...)}
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
