package wire

import (
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft"
)

// An interval set's ranges are sent as nft sends them (a start, and an end flagged as
// such after the last address, none for a range up to the family's last address) and
// decode back to the same ranges.
func TestIntervalSetRoundTrip(t *testing.T) {
	var ps []netip.Prefix
	for _, p := range []string{"0.0.0.0/8", "10.0.0.0/24", "10.0.1.0/24", "192.0.2.7/32", "255.255.255.0/24"} {
		ps = append(ps, netip.MustParsePrefix(p))
	}
	s := &nft.Set{Name: "fw", Key: []nft.Datatype{nft.TypeIPv4Addr}, Interval: true, Elements: nft.MergeRanges(ps)}
	rs := &nft.Ruleset{Family: nft.IPv4, Table: "t", Sets: []*nft.Set{s}}
	st, err := EncodeState(rs)
	if err != nil {
		t.Fatal(err)
	}
	ws := st.Sets["fw"]
	if ws.Flags&unix.NFT_SET_INTERVAL == 0 {
		t.Fatalf("flags %#x without NFT_SET_INTERVAL", ws.Flags)
	}
	ends := 0
	for _, e := range ws.Elements {
		if e.Flags&unix.NFT_SET_ELEM_INTERVAL_END != 0 {
			ends++
		}
	}
	// 4 ranges (10.0.0.0/24 and 10.0.1.0/24 merge); the last has no end element
	if len(ws.Elements) != 7 || ends != 3 {
		t.Errorf("%d kernel elements, %d ends; want 7 and 3", len(ws.Elements), ends)
	}
	got, _ := Decode(st)
	if a, b := nft.Render(got), nft.Render(rs); a != b {
		t.Errorf("decoded:\n%s\nwant:\n%s", a, b)
	}
}
