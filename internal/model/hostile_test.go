package model_test

import (
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"

	"github.com/nftproxy/nftproxy/internal/model"
)

// Endpoint addresses that can never be a pod's (docs/security.md, item 10) are skipped
// with a problem on their slice; the slice's other endpoints stay.
func TestBuildSkipsSpecialEndpointAddresses(t *testing.T) {
	svc := service("web", []string{"10.96.0.1"})
	sl := v4slice("web-a", "web", ports(tcp("http", 8080)),
		endpoint("127.0.0.1"), endpoint("169.254.169.254"), endpoint("0.0.0.0"), endpoint("255.255.255.255"),
		endpoint("224.0.0.5"), endpoint("10.0.0.1"))
	snap, problems := model.Build([]*v1.Service{svc}, []*discovery.EndpointSlice{sl}, nil)
	want := []string{"default/web:http/TCP ips=10.96.0.1 port=80 eps=10.0.0.1:8080/RS-"}
	if got := dumpSnapshot(snap); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("services:\n got  %q\n want %q", got, want)
	}
	checkProblems(t, problems, []string{
		"EndpointSlice default/web-a: endpoint address 127.0.0.1 is a loopback address, skipped",
		"EndpointSlice default/web-a: endpoint address 169.254.169.254 is a link-local address, skipped",
		"EndpointSlice default/web-a: endpoint address 0.0.0.0 is the unspecified address, skipped",
		"EndpointSlice default/web-a: endpoint address 255.255.255.255 is the broadcast address, skipped",
		"EndpointSlice default/web-a: endpoint address 224.0.0.5 is a multicast address, skipped",
	})
	for _, a := range []string{"::1", "fe80::1", "::", "ff02::1", "::ffff:127.0.0.1"} {
		if model.SpecialAddr(netip.MustParseAddr(a)) == "" {
			t.Errorf("SpecialAddr(%s) = \"\", want a reason", a)
		}
	}
	for _, a := range []string{"10.244.1.1", "fd00:244::1", "192.0.2.255", "2001:db8::1"} {
		if why := model.SpecialAddr(netip.MustParseAddr(a)); why != "" {
			t.Errorf("SpecialAddr(%s) = %q, want \"\"", a, why)
		}
	}
}

// loadBalancerSourceRanges are read as leniently as kube-proxy reads them
// (netutils.ParseCIDRSloppy after strings.TrimSpace).
func TestParsePrefixSloppy(t *testing.T) {
	for in, want := range map[string]string{
		"10.0.0.0/8":          "10.0.0.0/8",
		" 192.168.1.0/24 ":    "192.168.1.0/24",
		"\t10.1.0.0/16\n":     "10.1.0.0/16",
		"010.000.0.0/8":       "10.0.0.0/8",
		"192.168.001.000/024": "192.168.1.0/24",
		"10.1.2.3/08":         "10.1.2.3/8",
		"2001:db8::/32":       "2001:db8::/32",
		"::ffff:10.0.0.0/104": "10.0.0.0/8",
	} {
		got, err := model.ParsePrefixSloppy(in)
		if err != nil || got.String() != want {
			t.Errorf("ParsePrefixSloppy(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
	for _, in := range []string{"", "garbage", "10.0.0.0", "10.0.0.0/33", "256.0.0.0/8", "10.0.0/8", "10.0.0.0.0/8", "0x0a.0.0.0/8", "10.0.0.0/-1", "2001:db8::/129", "1.2.3.4/ 8"} {
		if got, err := model.ParsePrefixSloppy(in); err == nil {
			t.Errorf("ParsePrefixSloppy(%q) = %v, want an error", in, got)
		}
	}
}

// An unparsable source range marks the port: the compiler closes a family that has no
// usable range instead of leaving it open (docs/security.md, item 7).
func TestBuildSourceRangesBroken(t *testing.T) {
	for _, tc := range []struct {
		ranges []string
		want   string
		broken bool
	}{
		{[]string{"010.000.0.0/8"}, "10.0.0.0/8", false},
		{[]string{"bogus"}, "", true},
		{[]string{"bogus", " 10.0.0.0/8"}, "10.0.0.0/8", true},
		{[]string{"", "  "}, "", false}, // empty entries mean nothing, as upstream
	} {
		svc := polSvc(v1.ServiceTypeLoadBalancer, polIngress("198.51.100.7"), polRanges(tc.ranges...))
		snap, _ := model.Build([]*v1.Service{svc}, nil, nil)
		if len(snap.Services) != 1 {
			t.Fatalf("%q: %d service ports", tc.ranges, len(snap.Services))
		}
		sp := snap.Services[0]
		if got := polOf(sp).ranges; got != tc.want || sp.SourceRangesBroken != tc.broken {
			t.Errorf("%q: ranges %q broken %v, want %q %v", tc.ranges, got, sp.SourceRangesBroken, tc.want, tc.broken)
		}
	}
}
