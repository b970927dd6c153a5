package nft

import (
	"net/netip"
	"strings"
	"testing"
)

func TestMergeRanges(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string
	}{
		{"10.0.0.0/24", "10.0.0.0/24"},
		{"10.0.1.0/24 10.0.0.0/24", "10.0.0.0/23"},                      // touching: one range
		{"10.0.0.0/8 10.1.0.0/16 10.0.0.5/32", "10.0.0.0/8"},            // held in another
		{"10.0.0.0/24 10.0.2.0/24", "10.0.0.0/24 10.0.2.0/24"},          // a gap stays
		{"10.0.0.1/32 10.0.0.2/31", "10.0.0.1-10.0.0.3"},                // not a prefix
		{"255.255.255.255/32 255.255.255.254/32", "255.255.255.254/31"}, // up to the last address
		{"fd00::/64 fd00:0:0:1::/64", "fd00::/63"},
		{"::/128 ::1/128 ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128", "::/127 ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"},
	} {
		var ps []netip.Prefix
		for _, f := range strings.Fields(tc.in) {
			ps = append(ps, netip.MustParsePrefix(f))
		}
		s := &Set{Key: []Datatype{TypeIPv4Addr}, Interval: true}
		var got []string
		for _, e := range MergeRanges(ps) {
			got = append(got, RenderElementKey(s, e))
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("%s: got %q, want %q", tc.in, strings.Join(got, " "), tc.want)
		}
	}
}
