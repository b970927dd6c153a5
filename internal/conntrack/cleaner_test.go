package conntrack

import (
	"errors"
	"net"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/internal/model"
)

// call is one ConntrackDeleteFilters call seen by fakeDeleter.
type call struct {
	table   netlink.ConntrackTableType
	family  netlink.InetFamily
	filters []netlink.CustomConntrackFilter
}

// fakeDeleter records calls and answers each with the next result, then (1, nil).
type fakeDeleter struct {
	calls   []call
	results []error
}

func (d *fakeDeleter) ConntrackDeleteFilters(table netlink.ConntrackTableType, family netlink.InetFamily,
	filters ...netlink.CustomConntrackFilter) (uint, error) {
	d.calls = append(d.calls, call{table, family, filters})
	if len(d.results) == 0 {
		return 1, nil
	}
	err := d.results[0]
	d.results = d.results[1:]
	return 0, err
}

// entry is a conntrack entry: client → origDst:origPort, replies from replySrc:replyPort.
func entry(proto uint8, origDst string, origPort uint16, replySrc string, replyPort uint16) *netlink.ConntrackFlow {
	client := "10.244.9.9"
	if strings.Contains(origDst, ":") {
		client = "fd00:10::99"
	}
	return &netlink.ConntrackFlow{
		Forward: netlink.IPTuple{Protocol: proto, SrcIP: net.ParseIP(client), SrcPort: 40000,
			DstIP: net.ParseIP(origDst), DstPort: origPort},
		Reverse: netlink.IPTuple{Protocol: proto, SrcIP: net.ParseIP(replySrc), SrcPort: replyPort,
			DstIP: net.ParseIP(client), DstPort: 40000},
	}
}

func TestCleanFilters(t *testing.T) {
	d := &fakeDeleter{}
	c := &Cleaner{Deleter: d}
	flows := []Flow{
		toEp("10.96.0.10", 53, "10.244.1.3", 5353),
		nodePortToEp(30053, "10.244.1.3", 5353),
		notNATed("10.96.0.30", 123),
		nodePortNotNATed(30123, false),
		toEp("fd00:96::10", 53, "fd00:10::3", 5353),
	}
	n, err := c.Clean(flows)
	if err != nil || n != 2 {
		t.Fatalf("Clean = %d, %v; want 2 (one per family from the fake), nil", n, err)
	}
	if len(d.calls) != 2 {
		t.Fatalf("got %d calls, want one per family", len(d.calls))
	}
	for i, fam := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		if got := d.calls[i]; got.table != netlink.ConntrackTable || got.family != fam || len(got.filters) != 1 {
			t.Fatalf("call %d: table %d family %d with %d filters; want conntrack table, family %d, one filter",
				i, got.table, got.family, len(got.filters), fam)
		}
	}
	v4, v6 := d.calls[0].filters[0], d.calls[1].filters[0]

	for _, tc := range []struct {
		name   string
		filter netlink.CustomConntrackFilter
		ct     *netlink.ConntrackFlow
		want   bool
	}{
		{"cluster IP to the stale endpoint", v4, entry(model.ProtoUDP, "10.96.0.10", 53, "10.244.1.3", 5353), true},
		{"cluster IP to a live endpoint", v4, entry(model.ProtoUDP, "10.96.0.10", 53, "10.244.1.2", 5353), false},
		{"stale endpoint IP on another port", v4, entry(model.ProtoUDP, "10.96.0.10", 53, "10.244.1.3", 53), false},
		{"TCP to the stale endpoint", v4, entry(model.ProtoTCP, "10.96.0.10", 53, "10.244.1.3", 5353), false},
		{"another service to the stale endpoint", v4, entry(model.ProtoUDP, "10.96.0.20", 53, "10.244.1.3", 5353), false},
		{"pod straight to the stale endpoint", v4, entry(model.ProtoUDP, "10.244.1.3", 5353, "10.244.1.3", 5353), false},
		{"node port on one address to the stale endpoint", v4, entry(model.ProtoUDP, "172.18.0.2", 30053, "10.244.1.3", 5353), true},
		{"node port on another address to the stale endpoint", v4, entry(model.ProtoUDP, "192.168.1.7", 30053, "10.244.1.3", 5353), true},
		{"node port to a live endpoint", v4, entry(model.ProtoUDP, "172.18.0.2", 30053, "10.244.1.2", 5353), false},
		{"new service, entry nothing DNATed", v4, entry(model.ProtoUDP, "10.96.0.30", 123, "10.96.0.30", 123), true},
		{"new service, entry DNATed to an endpoint", v4, entry(model.ProtoUDP, "10.96.0.30", 123, "10.244.1.4", 123), false},
		{"new node port, entry nothing DNATed", v4, entry(model.ProtoUDP, "172.18.0.2", 30123, "172.18.0.2", 30123), true},
		{"new node port, entry DNATed to an endpoint", v4, entry(model.ProtoUDP, "172.18.0.2", 30123, "10.244.1.4", 123), false},
		{"IPv6 cluster IP to the stale endpoint", v6, entry(model.ProtoUDP, "fd00:96::10", 53, "fd00:10::3", 5353), true},
		{"IPv6 cluster IP to a live endpoint", v6, entry(model.ProtoUDP, "fd00:96::10", 53, "fd00:10::2", 5353), false},
		{"IPv6 entry on the IPv4 node port", v6, entry(model.ProtoUDP, "fd00::2", 30053, "fd00:10::3", 5353), false},
		{"IPv6 entry against the IPv4 filter", v4, entry(model.ProtoUDP, "fd00:96::10", 53, "fd00:10::3", 5353), false},
	} {
		if got := tc.filter.MatchConntrackFlow(tc.ct); got != tc.want {
			t.Errorf("%s: match = %v, want %v (%s)", tc.name, got, tc.want, tc.ct)
		}
	}
}

func TestCleanNothing(t *testing.T) {
	d := &fakeDeleter{}
	if n, err := (&Cleaner{Deleter: d}).Clean(nil); n != 0 || err != nil || len(d.calls) != 0 {
		t.Errorf("Clean(nil) = %d, %v with %d calls; want no call", n, err, len(d.calls))
	}
}

func TestCleanRetriesInterruptedDump(t *testing.T) {
	d := &fakeDeleter{results: []error{unix.EINTR}}
	n, err := (&Cleaner{Deleter: d}).Clean([]Flow{toEp("10.96.0.10", 53, "10.244.1.3", 5353)})
	if err != nil || n != 1 || len(d.calls) != 2 {
		t.Errorf("Clean = %d, %v after %d calls; want 1, nil after 2", n, err, len(d.calls))
	}

	d = &fakeDeleter{results: []error{unix.EINTR, unix.EINTR, unix.EINTR, unix.EINTR}}
	_, err = (&Cleaner{Deleter: d}).Clean([]Flow{toEp("10.96.0.10", 53, "10.244.1.3", 5353)})
	if !errors.Is(err, unix.EINTR) || len(d.calls) != maxAttempts {
		t.Errorf("Clean = %v after %d calls; want EINTR after %d", err, len(d.calls), maxAttempts)
	}
}

func TestCleanFailingFamilyDoesNotStopTheOther(t *testing.T) {
	d := &fakeDeleter{results: []error{syscall.EPERM}}
	n, err := (&Cleaner{Deleter: d}).Clean([]Flow{
		toEp("10.96.0.10", 53, "10.244.1.3", 5353),
		toEp("fd00:96::10", 53, "fd00:10::3", 5353),
	})
	if !errors.Is(err, syscall.EPERM) || !strings.Contains(err.Error(), "IPv4") {
		t.Errorf("err = %v, want EPERM naming IPv4", err)
	}
	if n != 1 || len(d.calls) != 2 {
		t.Errorf("deleted %d in %d calls; want the IPv6 one deleted, 2 calls", n, len(d.calls))
	}
}

func TestCleanSkipsMalformedFlows(t *testing.T) {
	d := &fakeDeleter{}
	good := toEp("10.96.0.10", 53, "10.244.1.3", 5353)
	bad := []Flow{
		{IPv6: false, OrigDstPort: 53}, // no protocol
		{Protocol: model.ProtoUDP},     // no port
		{Protocol: model.ProtoUDP, IPv6: true, OrigDstPort: 53, OrigDstIP: addr("10.96.0.10")}, // wrong family
	}
	n, err := (&Cleaner{Deleter: d}).Clean(append(bad, good))
	if err == nil || strings.Count(err.Error(), "\n") != len(bad)-1 {
		t.Errorf("err = %v, want one line per malformed flow", err)
	}
	if n != 1 || len(d.calls) != 1 {
		t.Fatalf("deleted %d in %d calls; want the good flow cleaned in 1 call", n, len(d.calls))
	}
	m := d.calls[0].filters[0].(*matcher)
	if len(m.byDst) != 1 || len(m.byDst[dstKey{model.ProtoUDP, addr("10.96.0.10"), 53}]) != 1 {
		t.Errorf("filter holds %v, want only the good flow", m.byDst)
	}
}

// TestCleanObserves: Observe hears every family on every Clean, with the entries that
// family's dump deleted; a family without flows reports 0 without a dump.
func TestCleanObserves(t *testing.T) {
	type seen struct {
		v6      bool
		deleted int
	}
	var got []seen
	d := &fakeDeleter{}
	c := &Cleaner{Deleter: d, Observe: func(v6 bool, took time.Duration, deleted int) {
		if took < 0 {
			t.Errorf("negative duration %v", took)
		}
		got = append(got, seen{v6, deleted})
	}}
	if _, err := c.Clean([]Flow{toEp("10.96.0.10", 53, "10.244.1.3", 5353)}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Clean(nil); err != nil {
		t.Fatal(err)
	}
	want := []seen{{false, 1}, {true, 0}, {false, 0}, {true, 0}}
	if !slices.Equal(got, want) || len(d.calls) != 1 {
		t.Errorf("observed %v with %d dumps, want %v with 1", got, len(d.calls), want)
	}
}
