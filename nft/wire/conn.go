package wire

import (
	"fmt"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft"
)

// Dial opens an nf_tables netlink socket in the network namespace open at netns (0: the
// current one), with strict checking of requests. Every socket nftproxy uses to write,
// dump or query nf_tables is opened here.
func Dial(netns int) (*netlink.Conn, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: netns, Strict: true})
	if err != nil {
		return nil, fmt.Errorf("opening nftables netlink socket: %w", err)
	}
	return c, nil
}

// DialEvents opens a socket for nf_tables change events (JoinGroup
// unix.NFNLGRP_NFTABLES): without strict checking, which a multicast listener does not
// need.
func DialEvents(netns int) (*netlink.Conn, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: netns})
	if err != nil {
		return nil, fmt.Errorf("opening nftables monitor socket: %w", err)
	}
	return c, nil
}

// QueryGen opens a socket in netns, asks for the ruleset generation and closes it.
func QueryGen(netns int) (uint32, error) {
	c, err := Dial(netns)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	return GenID(c)
}

// PortOf returns the netlink port id the socket is bound to. The kernel stamps every
// event and the NEWGEN of each transaction with the committing socket's port id.
func PortOf(c *netlink.Conn) (uint32, error) {
	if p := peerOf(c); p != nil {
		return p.port, nil
	}
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var port uint32
	var serr error
	if err := raw.Control(func(fd uintptr) {
		var sa unix.Sockaddr
		if sa, serr = unix.Getsockname(int(fd)); serr == nil {
			nl, ok := sa.(*unix.SockaddrNetlink)
			if !ok {
				serr = fmt.Errorf("netlink socket has address %T", sa)
				return
			}
			port = nl.Pid
		}
	}); err != nil {
		return 0, err
	}
	if serr != nil {
		return 0, fmt.Errorf("reading the netlink port id: %w", serr)
	}
	return port, nil
}

// TableNames lists the names of the tables of a family.
func TableNames(conn *netlink.Conn, fam nft.Family) ([]string, error) {
	msgs, err := Dump(conn, fam, unix.NFT_MSG_GETTABLE, nil)
	if err != nil {
		return nil, fmt.Errorf("listing %s tables: %w", fam, err)
	}
	var out []string
	for _, payload := range msgs {
		if name := stringAttr(payload, unix.NFTA_TABLE_NAME); name != "" {
			out = append(out, name)
		}
	}
	return out, nil
}

// ChainNames lists the names of the chains of every table of a family, by table.
func ChainNames(conn *netlink.Conn, fam nft.Family) (map[string][]string, error) {
	msgs, err := Dump(conn, fam, unix.NFT_MSG_GETCHAIN, nil)
	if err != nil {
		return nil, fmt.Errorf("listing %s chains: %w", fam, err)
	}
	out := map[string][]string{}
	for _, payload := range msgs {
		table, name := stringAttr(payload, unix.NFTA_CHAIN_TABLE), stringAttr(payload, unix.NFTA_CHAIN_NAME)
		out[table] = append(out[table], name)
	}
	return out, nil
}

// SetNames lists the names of a table's named (not anonymous) sets and maps.
func SetNames(conn *netlink.Conn, fam nft.Family, table string) ([]string, error) {
	msgs, err := Dump(conn, fam, unix.NFT_MSG_GETSET, func(ae *netlink.AttributeEncoder) {
		ae.String(unix.NFTA_SET_TABLE, table)
	})
	if err != nil {
		return nil, fmt.Errorf("listing sets of %s %s: %w", fam, table, err)
	}
	st := newTableState(fam, table)
	for _, payload := range msgs {
		if err := st.addSetMsg(payload); err != nil {
			return nil, err
		}
	}
	return sortedKeys(st.Sets), nil
}

// FlowtableNames lists the names of a table's flowtables.
func FlowtableNames(conn *netlink.Conn, fam nft.Family, table string) ([]string, error) {
	msgs, err := Dump(conn, fam, unix.NFT_MSG_GETFLOWTABLE, func(ae *netlink.AttributeEncoder) {
		ae.String(nftaFlowtableTable, table)
	})
	if err != nil {
		return nil, fmt.Errorf("listing flowtables of %s %s: %w", fam, table, err)
	}
	st := newTableState(fam, table)
	for _, payload := range msgs {
		if err := st.addFlowtableMsg(payload); err != nil {
			return nil, err
		}
	}
	return sortedKeys(st.Flowtables), nil
}

// stringAttr returns the string attribute typ of a message payload, "" if absent.
func stringAttr(payload []byte, typ uint16) string {
	var out string
	_ = walkAttrs(payload, func(t uint16, v []byte) error {
		if t == typ {
			out = cstring(v)
		}
		return nil
	})
	return out
}
