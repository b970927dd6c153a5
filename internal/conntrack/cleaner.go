package conntrack

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Deleter deletes the conntrack entries that match any of the filters, in one table
// and family. *netlink.Handle implements it; open the handle in the network namespace
// to clean (netlink.NewHandleAt(ns, unix.NETLINK_NETFILTER)).
type Deleter interface {
	ConntrackDeleteFilters(table netlink.ConntrackTableType, family netlink.InetFamily,
		filters ...netlink.CustomConntrackFilter) (uint, error)
}

// maxAttempts bounds the retries when the kernel interrupts the table dump (the table
// changed under it: EINTR).
const maxAttempts = 3

// Cleaner deletes the conntrack entries that Flows select.
type Cleaner struct {
	Deleter Deleter
	// Observe, if set, is called once per family on every Clean, with how long that
	// family's cleanup took and how many entries it deleted; a family with no flow
	// takes no table dump and reports about 0 s and 0 entries (the metric
	// kubeproxy_conntrack_reconciler_*).
	Observe func(v6 bool, took time.Duration, deleted int)
}

// Clean deletes the entries the flows select and returns how many it deleted. Run it
// after the ruleset that made them stale is committed, or packets recreate them. Each
// family takes one table dump whatever the number of flows. A malformed flow is
// reported and skipped, never widened; a failing family does not stop the other.
func (c *Cleaner) Clean(flows []Flow) (deleted int, err error) {
	var v4, v6 []Flow
	var errs []error
	for _, f := range flows {
		switch err := f.validate(); {
		case err != nil:
			errs = append(errs, err)
		case f.IPv6:
			v6 = append(v6, f)
		default:
			v4 = append(v4, f)
		}
	}
	for _, fam := range []struct {
		v6    bool
		flows []Flow
	}{{false, v4}, {true, v6}} {
		start := time.Now()
		n, err := c.deleteFamily(fam.v6, fam.flows)
		if c.Observe != nil {
			c.Observe(fam.v6, time.Since(start), n)
		}
		deleted += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	return deleted, errors.Join(errs...)
}

// deleteFamily deletes the entries of one family that flows select, retrying a dump
// the kernel interrupted.
func (c *Cleaner) deleteFamily(v6 bool, flows []Flow) (int, error) {
	if len(flows) == 0 {
		return 0, nil
	}
	fam, name := netlink.InetFamily(unix.AF_INET), "IPv4"
	if v6 {
		fam, name = netlink.InetFamily(unix.AF_INET6), "IPv6"
	}
	m := newMatcher(v6, flows)
	var total uint
	for attempt := 1; ; attempt++ {
		n, err := c.Deleter.ConntrackDeleteFilters(netlink.ConntrackTable, fam, m)
		total += n
		if err == nil {
			return int(total), nil
		}
		if !errors.Is(err, unix.EINTR) || attempt == maxAttempts {
			return int(total), fmt.Errorf("deleting %s conntrack entries for %d flows (attempt %d): %w",
				name, len(flows), attempt, err)
		}
	}
}

// matcher is one netlink filter for all the flows of a family, indexed by protocol,
// original destination address and port, so that each table entry is checked against
// the few flows that can match it, not all of them: after a repair every cluster IP has
// a flow (Escaped), and thousands of them may share a port.
type matcher struct {
	v6    bool
	byDst map[dstKey][]Flow
}

// dstKey indexes flows by their original destination; addr is invalid for the flows
// that match any address (node ports).
type dstKey struct {
	proto uint8
	addr  netip.Addr
	port  uint16
}

var _ netlink.CustomConntrackFilter = (*matcher)(nil)

func newMatcher(v6 bool, flows []Flow) *matcher {
	m := &matcher{v6: v6, byDst: map[dstKey][]Flow{}}
	for _, f := range flows {
		k := dstKey{f.Protocol, f.OrigDstIP, f.OrigDstPort}
		if !portsParsed(f.Protocol) {
			k.port = 0 // see Flow.Matches
		}
		m.byDst[k] = append(m.byDst[k], f)
	}
	return m
}

// MatchConntrackFlow reports whether any flow selects the entry ct.
func (m *matcher) MatchConntrackFlow(ct *netlink.ConntrackFlow) bool {
	if isIPv6(ct.Forward.DstIP) != m.v6 {
		return false
	}
	k := dstKey{proto: ct.Forward.Protocol, port: ct.Forward.DstPort}
	if !portsParsed(k.proto) {
		k.port = 0
	}
	if m.matchAny(ct, k) { // flows for any address
		return true
	}
	a, ok := netip.AddrFromSlice(ct.Forward.DstIP)
	if !ok {
		return false
	}
	k.addr = a.Unmap()
	return m.matchAny(ct, k)
}

func (m *matcher) matchAny(ct *netlink.ConntrackFlow, k dstKey) bool {
	for _, f := range m.byDst[k] {
		if f.Matches(ct) {
			return true
		}
	}
	return false
}
