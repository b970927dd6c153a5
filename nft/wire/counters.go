package wire

import (
	"encoding/binary"
	"fmt"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft"
)

// EachCounter calls fn with the key, comment and counter of every element of a
// NFT_MSG_NEWSETELEM payload that has one. It walks the attributes in place: a
// read of 20,000 elements allocates nothing per element.
func EachCounter(payload []byte, fn func(key []byte, comment string, packets, bytes uint64)) error {
	return walkAttrs(payload, func(typ uint16, list []byte) error {
		if typ != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
			return nil
		}
		return walkAttrs(list, func(_ uint16, elem []byte) error {
			var key []byte
			var comment string
			var packets, bytes uint64
			found := false
			err := walkAttrs(elem, func(typ uint16, b []byte) error {
				switch typ {
				case unix.NFTA_SET_ELEM_KEY:
					return walkAttrs(b, func(typ uint16, v []byte) error {
						if typ == unix.NFTA_DATA_VALUE {
							key = v
						}
						return nil
					})
				case unix.NFTA_SET_ELEM_USERDATA:
					comment = CommentOf(b)
				case nftaSetElemExpr:
					packets, bytes, found = counterOf(b)
				case nftaSetElemExpressions:
					return walkAttrs(b, func(_ uint16, e []byte) error {
						if !found {
							packets, bytes, found = counterOf(e)
						}
						return nil
					})
				}
				return nil
			})
			if err == nil && found && key != nil {
				fn(key, comment, packets, bytes)
			}
			return err
		})
	})
}

// counterOf decodes one expression: its packets and bytes if it is a counter.
func counterOf(b []byte) (packets, bytes uint64, ok bool) {
	var data []byte
	if walkAttrs(b, func(typ uint16, v []byte) error {
		switch typ {
		case unix.NFTA_EXPR_NAME:
			ok = cstring(v) == "counter"
		case unix.NFTA_EXPR_DATA:
			data = v
		}
		return nil
	}) != nil || !ok || data == nil {
		return 0, 0, false
	}
	err := walkAttrs(data, func(typ uint16, v []byte) error {
		if len(v) != 8 {
			return nil
		}
		switch typ {
		case unix.NFTA_COUNTER_PACKETS:
			packets = binary.BigEndian.Uint64(v)
		case unix.NFTA_COUNTER_BYTES:
			bytes = binary.BigEndian.Uint64(v)
		}
		return nil
	})
	return packets, bytes, err == nil
}

// walkAttrs calls fn with the type (flags cleared) and payload of each netlink
// attribute in b.
func walkAttrs(b []byte, fn func(typ uint16, data []byte) error) error {
	for len(b) >= 4 {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		if l < 4 || l > len(b) {
			return fmt.Errorf("malformed netlink attribute (length %d of %d bytes)", l, len(b))
		}
		if err := fn(binary.NativeEndian.Uint16(b[2:4])&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER), b[4:l]); err != nil {
			return err
		}
		b = b[min((l+3)&^3, len(b)):]
	}
	return nil
}

// SetElemCounters dumps the elements of a set and calls fn with the key, comment and
// counter of each one that has a counter. The key slice is valid only during the call.
func SetElemCounters(conn *netlink.Conn, fam nft.Family, table, set string, fn func(key []byte, comment string, packets, bytes uint64)) error {
	msgs, err := Dump(conn, fam, unix.NFT_MSG_GETSETELEM, func(ae *netlink.AttributeEncoder) {
		ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, table)
		ae.String(unix.NFTA_SET_ELEM_LIST_SET, set)
	})
	if err != nil {
		return fmt.Errorf("reading the elements of %s %s %s: %w", fam, table, set, err)
	}
	for _, m := range msgs {
		if err := EachCounter(m, fn); err != nil {
			return fmt.Errorf("decoding the elements of %s %s %s: %w", fam, table, set, err)
		}
	}
	return nil
}

// RuleCounters dumps the rules of a chain and returns the packets and bytes of every
// counter expression in them, in order.
func RuleCounters(conn *netlink.Conn, fam nft.Family, table, chain string) (packets, bytes []uint64, err error) {
	msgs, err := Dump(conn, fam, unix.NFT_MSG_GETRULE, func(ae *netlink.AttributeEncoder) {
		ae.String(unix.NFTA_RULE_TABLE, table)
		ae.String(unix.NFTA_RULE_CHAIN, chain)
	})
	if err != nil {
		return nil, nil, fmt.Errorf("reading rules of %s %s %s: %w", fam, table, chain, err)
	}
	for _, m := range msgs {
		err := walkAttrs(m, func(typ uint16, list []byte) error {
			if typ != unix.NFTA_RULE_EXPRESSIONS {
				return nil
			}
			return walkAttrs(list, func(_ uint16, e []byte) error {
				if p, b, ok := counterOf(e); ok {
					packets, bytes = append(packets, p), append(bytes, b)
				}
				return nil
			})
		})
		if err != nil {
			return nil, nil, fmt.Errorf("decoding rules of %s %s %s: %w", fam, table, chain, err)
		}
	}
	return packets, bytes, nil
}
