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
// the result is one consistent state even while another process commits transactions;
// an error while the generation moved (a set deleted between its listing and the dump
// of its elements) is such a change too, and is read again.
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
		after, gerr := GenID(conn)
		if gerr != nil {
			return nil, gerr
		}
		switch {
		case err == nil && before == after:
			return st, nil
		case err != nil && before == after && !errors.Is(err, errInterrupted):
			// the ruleset did not change: the error is the reading's own
			return nil, err
		}
		// the ruleset changed while it was read: a dump interrupted, or an object listed
		// then gone before its own dump (ENOENT for a set's elements), or a state that
		// mixes two generations; read it again
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
//
// The answers are read with a buffer of dumpBuffer bytes, not through netlink.Conn's
// Receive: the kernel sizes each message of a dump by the largest read the socket has
// seen (up to 32 KiB), and Receive reads a page at a time, so a dump came in 4 KiB
// messages. A set's elements are dumped by walking the set from the start for every
// message and skipping what was already sent, which makes a big set's dump quadratic in
// its messages: 8 times fewer messages make it about 8 times cheaper.
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
	req, err := conn.Send(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | typ), Flags: netlink.Request | netlink.Dump},
		Data:   append([]byte{byte(fam), unix.NFNETLINK_V0, 0, 0}, data...),
	})
	if err != nil {
		return nil, err
	}
	if peerOf(conn) != nil { // a peer answers a dump at once, in one datagram
		msgs, err := conn.Receive()
		if err != nil {
			return nil, err
		}
		var out [][]byte
		for _, m := range msgs {
			if m.Header.Sequence == req.Header.Sequence && len(m.Data) >= 4 {
				out = append(out, m.Data[4:])
			}
		}
		return out, nil
	}
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	buf := make([]byte, dumpBuffer)
	var out [][]byte
	interrupted := false
	for {
		var n int
		var rerr error
		if err := raw.Read(func(fd uintptr) bool {
			n, _, _, _, rerr = unix.Recvmsg(int(fd), buf, nil, 0)
			return rerr != unix.EAGAIN
		}); err != nil {
			return nil, err
		}
		if rerr != nil {
			if errors.Is(rerr, syscall.EINTR) {
				return nil, errInterrupted
			}
			return nil, rerr
		}
		// the payloads returned point into the datagram: a copy, since buf is read into again
		msgs, err := syscall.ParseNetlinkMessage(append([]byte(nil), buf[:n]...))
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			if m.Header.Seq != req.Header.Sequence {
				continue // a stale answer to an earlier request
			}
			interrupted = interrupted || m.Header.Flags&unix.NLM_F_DUMP_INTR != 0
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				if interrupted {
					return nil, errInterrupted
				}
				return out, nil
			case unix.NLMSG_ERROR:
				if len(m.Data) < 4 {
					return nil, errors.New("dump: short error message")
				}
				if errno := -int32(binary.NativeEndian.Uint32(m.Data[:4])); errno != 0 {
					err := syscall.Errno(errno)
					if errors.Is(err, syscall.EINTR) || errors.Is(err, syscall.EAGAIN) {
						return nil, errInterrupted
					}
					return nil, err
				}
				return out, nil
			}
			if len(m.Data) >= 4 {
				out = append(out, m.Data[4:])
			}
		}
	}
}

// dumpBuffer is the read size for dumps: more than the kernel's largest dump message
// (SKB_WITH_OVERHEAD(32768)).
const dumpBuffer = 64 << 10

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
	fts, err := Dump(conn, fam, unix.NFT_MSG_GETFLOWTABLE, func(ae *netlink.AttributeEncoder) {
		ae.String(nftaFlowtableTable, table)
	})
	if err != nil {
		return nil, fmt.Errorf("listing flowtables of %s %s: %w", fam, table, err)
	}
	for _, payload := range fts {
		if err := st.addFlowtableMsg(payload); err != nil {
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
