package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft"
)

// This file reads from the kernel: one table, consistently (ReadTable), the ruleset
// generation (GenID), and any dump (Dump).

// maxReadAttempts bounds how often ReadTable starts over because the ruleset changed
// while it was being read.
const maxReadAttempts = 20

// ReadTable reads a table from the kernel of the network namespace open at netns (0:
// the current one): chains with hooks, rules, set definitions and all elements. The
// reads are retried until the ruleset generation is the same before and after them, so
// the result is one consistent state even while another process commits transactions.
func ReadTable(netns int, fam nft.Family, table string) (*TableState, error) {
	conn, err := Dial(netns)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	var lastErr error
	for range maxReadAttempts {
		before, err := GenID(conn)
		if err != nil {
			return nil, err
		}
		st, err := readTable(conn, fam, table)
		if err != nil && !errors.Is(err, errInterrupted) {
			return nil, err
		}
		after, gerr := GenID(conn)
		if gerr != nil {
			return nil, gerr
		}
		if err == nil && before == after {
			return st, nil
		}
		lastErr = fmt.Errorf("the ruleset changed while it was read (generation %d → %d)", before, after)
	}
	return nil, fmt.Errorf("reading %s %s: %w, %d times", fam, table, lastErr, maxReadAttempts)
}

var errInterrupted = errors.New("dump interrupted")

func GenID(conn *netlink.Conn) (uint32, error) {
	msgs, err := conn.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN), Flags: netlink.Request},
		Data:   []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	})
	if err != nil {
		return 0, fmt.Errorf("reading the ruleset generation: %w", err)
	}
	for _, m := range msgs {
		ad, err := attrs(m.Data)
		if err != nil {
			return 0, err
		}
		for ad.Next() {
			if ad.Type() == unix.NFTA_GEN_ID {
				return ad.Uint32(), ad.Err()
			}
		}
	}
	return 0, errors.New("reading the ruleset generation: no NFTA_GEN_ID in the answer")
}

// Dump sends a dump request and returns the answers' attribute payloads.
func Dump(conn *netlink.Conn, fam nft.Family, typ uint16, build func(ae *netlink.AttributeEncoder)) ([][]byte, error) {
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian
	if build != nil {
		build(ae)
	}
	data, err := ae.Encode()
	if err != nil {
		return nil, err
	}
	msgs, err := conn.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | typ), Flags: netlink.Request | netlink.Dump},
		Data:   append([]byte{byte(fam), unix.NFNETLINK_V0, 0, 0}, data...),
	})
	if err != nil {
		if errors.Is(err, syscall.EINTR) || errors.Is(err, syscall.EAGAIN) {
			return nil, errInterrupted
		}
		return nil, err
	}
	var out [][]byte
	for _, m := range msgs {
		if m.Header.Flags&netlink.DumpInterrupted != 0 {
			return nil, errInterrupted
		}
		if len(m.Data) >= 4 {
			out = append(out, m.Data[4:])
		}
	}
	return out, nil
}

func readTable(conn *netlink.Conn, fam nft.Family, table string) (*TableState, error) {
	st := newTableState(fam, table)
	tables, err := Dump(conn, fam, unix.NFT_MSG_GETTABLE, nil)
	if err != nil {
		return nil, fmt.Errorf("listing %s tables: %w", fam, err)
	}
	for _, payload := range tables {
		ad, err := decoder(payload)
		if err != nil {
			return nil, err
		}
		for ad.Next() {
			if ad.Type() == unix.NFTA_TABLE_NAME && ad.String() == table {
				st.Exists = true
			}
		}
	}
	if !st.Exists {
		return st, nil
	}
	chains, err := Dump(conn, fam, unix.NFT_MSG_GETCHAIN, nil)
	if err != nil {
		return nil, fmt.Errorf("listing chains of %s %s: %w", fam, table, err)
	}
	for _, payload := range chains {
		if err := st.addChainMsg(payload); err != nil {
			return nil, err
		}
	}
	rules, err := Dump(conn, fam, unix.NFT_MSG_GETRULE, func(ae *netlink.AttributeEncoder) {
		ae.String(unix.NFTA_RULE_TABLE, table)
	})
	if err != nil {
		return nil, fmt.Errorf("listing rules of %s %s: %w", fam, table, err)
	}
	for _, payload := range rules {
		if err := st.addRuleMsg(payload); err != nil {
			return nil, err
		}
	}
	sets, err := Dump(conn, fam, unix.NFT_MSG_GETSET, func(ae *netlink.AttributeEncoder) {
		ae.String(unix.NFTA_SET_TABLE, table)
	})
	if err != nil {
		return nil, fmt.Errorf("listing sets of %s %s: %w", fam, table, err)
	}
	for _, payload := range sets {
		if err := st.addSetMsg(payload); err != nil {
			return nil, err
		}
	}
	for _, name := range sortedKeys(st.Sets) {
		elems, err := Dump(conn, fam, unix.NFT_MSG_GETSETELEM, func(ae *netlink.AttributeEncoder) {
			ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, table)
			ae.String(unix.NFTA_SET_ELEM_LIST_SET, name)
		})
		if err != nil {
			return nil, fmt.Errorf("listing elements of set %s %s %s: %w", fam, table, name, err)
		}
		for _, payload := range elems {
			if err := st.addElemsMsg(payload); err != nil {
				return nil, err
			}
		}
	}
	return st, nil
}
