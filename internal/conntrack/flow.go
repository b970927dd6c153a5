// Package conntrack keeps conntrack state consistent with the service map.
//
// UDP has no connection teardown: a conntrack entry that DNATs a client to an endpoint
// lives as long as the client keeps sending, even after the endpoint is gone, and an
// entry created while a service had no endpoint (nothing DNATed it) keeps its packets
// away from the endpoints that appear later. Between two snapshots Stale computes the
// few entries that must go, as Flow filters; Cleaner deletes exactly those through
// netlink. TCP and SCTP entries DNATed to an endpoint are never touched: their
// endpoints reset or time out. The one exception is a broken table: connections to
// cluster IPs of any protocol that escaped NAT while it was broken are deleted after
// its repair (Escaped).
package conntrack

import (
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/nftproxy/nftproxy/internal/model"
)

// Flow selects conntrack entries by their original destination and reply source, in
// the terms of conntrack(8). Unset fields match anything; Protocol and OrigDstPort are
// always set.
type Flow struct {
	Protocol uint8 // model.ProtoTCP, ProtoUDP or ProtoSCTP
	// IPv6 is the family of the entries; addresses set below must be of that family.
	IPv6        bool
	OrigDstIP   netip.Addr // --orig-dst; invalid: any (node ports)
	OrigDstPort uint16     // --orig-port-dst
	// ReplySrcIP and ReplySrcPort are where replies come from: the endpoint for a
	// DNATed entry, the original destination itself for one nothing DNATed.
	ReplySrcIP   netip.Addr // --reply-src; invalid: any
	ReplySrcPort uint16     // --reply-port-src; 0: any
}

// String renders the flow as conntrack(8) arguments, so that a logged flow can be
// inspected with `conntrack -L` or deleted by hand.
func (f Flow) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "-f %s -p %s", f.familyName(), strings.ToLower(model.ProtoString(f.Protocol)))
	if f.OrigDstIP.IsValid() {
		fmt.Fprintf(&b, " --orig-dst %s", f.OrigDstIP)
	}
	fmt.Fprintf(&b, " --orig-port-dst %d", f.OrigDstPort)
	if f.ReplySrcIP.IsValid() {
		fmt.Fprintf(&b, " --reply-src %s", f.ReplySrcIP)
	}
	if f.ReplySrcPort != 0 {
		fmt.Fprintf(&b, " --reply-port-src %d", f.ReplySrcPort)
	}
	return b.String()
}

func (f Flow) familyName() string {
	if f.IPv6 {
		return "ipv6"
	}
	return "ipv4"
}

// Matches reports whether the conntrack entry ct is one the flow selects.
//
// The netlink library parses the ports of TCP and UDP entries only: an SCTP entry
// reaches a filter with ports 0. A flow of such a protocol then matches on its
// addresses alone, and only if it names both (an entry to OrigDstIP, on any port,
// whose replies come from ReplySrcIP): never a flow without addresses, which would
// select every entry of the protocol.
func (f Flow) Matches(ct *netlink.ConntrackFlow) bool {
	fwd, rev := &ct.Forward, &ct.Reverse
	ports := fwd.DstPort == f.OrigDstPort && (f.ReplySrcPort == 0 || rev.SrcPort == f.ReplySrcPort)
	if !ports && unparsedPorts(ct) {
		ports = f.OrigDstIP.IsValid() && f.ReplySrcIP.IsValid()
	}
	return fwd.Protocol == f.Protocol &&
		ports &&
		isIPv6(fwd.DstIP) == f.IPv6 &&
		addrMatches(f.OrigDstIP, fwd.DstIP) &&
		addrMatches(f.ReplySrcIP, rev.SrcIP)
}

// portsParsed reports whether the netlink library fills in the ports of entries of the
// protocol (vishvananda/netlink v1.3.1, parseIpTuple: TCP and UDP only).
func portsParsed(proto uint8) bool { return proto == model.ProtoTCP || proto == model.ProtoUDP }

// unparsedPorts reports whether ct is an entry whose ports the library did not parse.
func unparsedPorts(ct *netlink.ConntrackFlow) bool {
	fwd, rev := &ct.Forward, &ct.Reverse
	return !portsParsed(fwd.Protocol) && fwd.SrcPort == 0 && fwd.DstPort == 0 && rev.SrcPort == 0 && rev.DstPort == 0
}

// validate rejects flows that are malformed; a malformed flow is never widened into a
// broader deletion.
func (f Flow) validate() error {
	switch {
	case f.Protocol == 0:
		return fmt.Errorf("flow %s: no protocol", f)
	case f.OrigDstPort == 0:
		return fmt.Errorf("flow %s: no original destination port", f)
	case f.OrigDstIP.IsValid() && f.OrigDstIP.Is6() != f.IPv6,
		f.ReplySrcIP.IsValid() && f.ReplySrcIP.Is6() != f.IPv6:
		return fmt.Errorf("flow %s: address of the wrong family", f)
	}
	return nil
}

// compare orders flows for a stable output: family, protocol, port, addresses.
func (f Flow) compare(o Flow) int {
	if f.IPv6 != o.IPv6 {
		if f.IPv6 {
			return 1
		}
		return -1
	}
	if c := int(f.Protocol) - int(o.Protocol); c != 0 {
		return c
	}
	if c := int(f.OrigDstPort) - int(o.OrigDstPort); c != 0 {
		return c
	}
	if c := f.OrigDstIP.Compare(o.OrigDstIP); c != 0 {
		return c
	}
	if c := f.ReplySrcIP.Compare(o.ReplySrcIP); c != 0 {
		return c
	}
	return int(f.ReplySrcPort) - int(o.ReplySrcPort)
}

func isIPv6(ip net.IP) bool { return ip.To4() == nil }

func addrMatches(want netip.Addr, got net.IP) bool {
	if !want.IsValid() {
		return true
	}
	a, ok := netip.AddrFromSlice(got)
	return ok && a.Unmap() == want
}
