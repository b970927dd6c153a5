package admit

import (
	"net/netip"
	"testing"

	"github.com/nftproxy/nftproxy/internal/model"
)

// addrCounts never says no for an address it counts, says no for every address once
// all are taken back, and keeps eight buckets per address as the count grows.
func TestAddrCounts(t *testing.T) {
	var a addrCounts
	eps := make([]model.Endpoint, 20000)
	for k := range eps {
		eps[k].Addr = netip.AddrFrom4([4]byte{10, byte(128 + k/65536), byte(k / 256), byte(k)})
	}
	sp := &model.ServicePort{Endpoints: eps}
	a.add(eps, +1)
	a.resize([]*model.ServicePort{sp})
	if len(a.buckets) < 8*len(eps) {
		t.Fatalf("%d buckets for %d addresses, want at least 8 per address", len(a.buckets), len(eps))
	}
	for _, e := range eps {
		if !a.anyOf(map[netip.Addr]bool{e.Addr: true}) {
			t.Fatalf("%v is counted but anyOf says no", e.Addr)
		}
	}
	misses := 0
	for k := range 1000 {
		if !a.anyOf(map[netip.Addr]bool{netip.AddrFrom4([4]byte{10, 96, byte(k / 256), byte(k)}): true}) {
			misses++
		}
	}
	if misses < 800 { // seven in eight expected
		t.Errorf("only %d of 1000 addresses not counted found a zero bucket", misses)
	}
	a.add(eps, -1)
	for _, b := range a.buckets {
		if b != 0 {
			t.Fatal("a bucket stays above zero after every address was taken back")
		}
	}
	a.resize(nil)
	if len(a.buckets) != minAddrBuckets {
		t.Errorf("%d buckets for no address, want %d", len(a.buckets), minAddrBuckets)
	}

	// an IPv6 table counts only IPv6 endpoints: an IPv4 cluster's 300,000 cost it nothing
	v6 := addrCounts{v6: true}
	v6.add(eps, +1)
	v6.resize([]*model.ServicePort{sp})
	if v6.n != 0 || len(v6.buckets) != minAddrBuckets {
		t.Errorf("IPv6 counts of IPv4 endpoints: %d counted, %d buckets", v6.n, len(v6.buckets))
	}
}
