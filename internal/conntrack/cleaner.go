package conntrack

import (
	"errors"
	"fmt"
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

// matcher is one netlink filter for all the flows of a family, indexed by protocol and
// original destination port so that each table entry is checked against the few flows
// that can match it, not all of them.
type matcher struct {
	v6     bool
	byPort map[protoPort][]Flow
}

type protoPort struct {
	proto uint8
	port  uint16
}

var _ netlink.CustomConntrackFilter = (*matcher)(nil)

func newMatcher(v6 bool, flows []Flow) *matcher {
	m := &matcher{v6: v6, byPort: map[protoPort][]Flow{}}
	for _, f := range flows {
		k := protoPort{f.Protocol, f.OrigDstPort}
		m.byPort[k] = append(m.byPort[k], f)
	}
	return m
}

// MatchConntrackFlow reports whether any flow selects the entry ct.
func (m *matcher) MatchConntrackFlow(ct *netlink.ConntrackFlow) bool {
	if isIPv6(ct.Forward.DstIP) != m.v6 {
		return false
	}
	for _, f := range m.byPort[protoPort{ct.Forward.Protocol, ct.Forward.DstPort}] {
		if f.Matches(ct) {
			return true
		}
	}
	return false
}
