package wire

import (
	"encoding/binary"
	"errors"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft"
)

// Event is one nf_tables message received on the events socket (DialEvents).
type Event struct {
	Type   uint16 // NFT_MSG_*: NEWGEN closes a committed transaction
	Port   uint32 // netlink port id of the socket that committed it
	Family nft.Family
	// Table and Name: the table of an object event, and the name of the chain, set,
	// object or flowtable it is about (empty for table events and NEWGEN)
	Table, Name string
	// Skipped: an object event that skip asked to leave undecoded
	Skipped bool
	// Object: the event is about a table or an object in one (not NEWGEN or other)
	Object bool
	// Gen, PID and Process: the generation and committing task of a NEWGEN
	Gen     uint32
	PID     uint32
	Process string
}

// ErrMalformed reports a datagram whose netlink framing does not hold together.
var ErrMalformed = errors.New("malformed netlink datagram")

// nameAttrs is, per object event, the attribute naming the object. Every event carries
// its table's name in attribute 1 (NFTA_TABLE_NAME, NFTA_CHAIN_TABLE, NFTA_RULE_TABLE,
// NFTA_SET_TABLE, NFTA_SET_ELEM_LIST_TABLE, NFTA_OBJ_TABLE, NFTA_FLOWTABLE_TABLE).
var nameAttrs = map[uint16]uint16{
	unix.NFT_MSG_NEWTABLE:     0,
	unix.NFT_MSG_DELTABLE:     0,
	unix.NFT_MSG_NEWCHAIN:     unix.NFTA_CHAIN_NAME,
	unix.NFT_MSG_DELCHAIN:     unix.NFTA_CHAIN_NAME,
	unix.NFT_MSG_NEWSET:       unix.NFTA_SET_NAME,
	unix.NFT_MSG_DELSET:       unix.NFTA_SET_NAME,
	unix.NFT_MSG_NEWRULE:      unix.NFTA_RULE_CHAIN,
	unix.NFT_MSG_DELRULE:      unix.NFTA_RULE_CHAIN,
	unix.NFT_MSG_NEWSETELEM:   unix.NFTA_SET_ELEM_LIST_SET,
	unix.NFT_MSG_DELSETELEM:   unix.NFTA_SET_ELEM_LIST_SET,
	unix.NFT_MSG_NEWOBJ:       unix.NFTA_OBJ_NAME,
	unix.NFT_MSG_DELOBJ:       unix.NFTA_OBJ_NAME,
	unix.NFT_MSG_NEWFLOWTABLE: nftaFlowtableName,
	unix.NFT_MSG_DELFLOWTABLE: nftaFlowtableName,
}

// Events calls fn with each nf_tables message of one datagram received on the events
// socket; messages of other subsystems are skipped. Decoding the names of an object
// event costs a walk of its attributes: skip(port) returning true leaves them out (a
// full rewrite by our own socket is tens of thousands of events). It returns
// ErrMalformed if the framing breaks: what followed is unknown.
func Events(datagram []byte, skip func(port uint32) bool, fn func(Event)) error {
	b := datagram
	for len(b) >= unix.NLMSG_HDRLEN {
		l := int(binary.NativeEndian.Uint32(b[0:4]))
		if l < unix.NLMSG_HDRLEN || l > len(b) {
			return ErrMalformed
		}
		typ := binary.NativeEndian.Uint16(b[4:6])
		port := binary.NativeEndian.Uint32(b[12:16])
		if data := b[unix.NLMSG_HDRLEN:l]; typ>>8 == unix.NFNL_SUBSYS_NFTABLES && len(data) >= 4 {
			ev := Event{Type: typ & 0xff, Port: port, Family: nft.Family(data[0])}
			nameAttr, isObject := nameAttrs[ev.Type]
			ev.Object = isObject
			switch {
			case ev.Type == unix.NFT_MSG_NEWGEN:
				ev.Gen, ev.PID, ev.Process = decodeGen(data[4:])
			case isObject && skip != nil && skip(port):
				ev.Skipped = true
			case isObject:
				_ = walkAttrs(data[4:], func(t uint16, v []byte) error {
					switch {
					case t == 1:
						ev.Table = cstring(v)
					case nameAttr != 0 && t == nameAttr:
						ev.Name = cstring(v)
					}
					return nil
				})
			}
			fn(ev)
		}
		b = b[min((l+unix.NLMSG_ALIGNTO-1)&^(unix.NLMSG_ALIGNTO-1), len(b)):]
	}
	return nil
}

// decodeGen reads NFT_MSG_NEWGEN's attributes.
func decodeGen(attrs []byte) (gen, pid uint32, proc string) {
	_ = walkAttrs(attrs, func(t uint16, v []byte) error {
		switch t {
		case unix.NFTA_GEN_ID:
			gen = be32(v)
		case unix.NFTA_GEN_PROC_PID:
			pid = be32(v)
		case unix.NFTA_GEN_PROC_NAME:
			proc = cstring(v)
		}
		return nil
	})
	return gen, pid, proc
}
