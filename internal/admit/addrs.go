package admit

import (
	"hash/maphash"
	"math"
	"net/netip"

	"github.com/nftproxy/nftproxy/internal/model"
)

// addrCounts counts addresses in buckets of saturating counters, at least eight buckets
// per address counted (the table doubles as the count grows). A bucket at zero holds
// none of the addresses; one above zero may (another address shares it, or its counter
// saturated and no longer goes down), which costs a look, never a wrong answer. With
// eight buckets per address, seven lookups in eight of an address not counted find
// zero (with as many buckets as addresses, one in three).
type addrCounts struct {
	seed    maphash.Seed
	buckets []uint8
	n       int  // addresses counted (added minus removed)
	v6      bool // the family counted: a table's parts hold only its family's endpoints
}

const minAddrBuckets = 1 << 12

func (a *addrCounts) bucket(addr netip.Addr) *uint8 {
	if a.buckets == nil {
		a.seed, a.buckets = maphash.MakeSeed(), make([]uint8, minAddrBuckets)
	}
	return &a.buckets[maphash.Comparable(a.seed, addr.As16())&uint64(len(a.buckets)-1)]
}

// add counts the addresses of the endpoints of the family d (+1 or -1) times.
func (a *addrCounts) add(eps []model.Endpoint, d int) {
	n := 0
	for i := range eps {
		if eps[i].Addr.Is6() != a.v6 {
			continue
		}
		n++
		b := a.bucket(eps[i].Addr)
		switch {
		case *b == math.MaxUint8: // saturated: stays
		case d > 0:
			*b++
		case *b > 0:
			*b--
		}
	}
	a.n += d * n
}

// resize makes the table eight buckets per address again, counting services' endpoints
// anew, when the count has outgrown it (or shrunk to a quarter of it).
func (a *addrCounts) resize(services []*model.ServicePort) {
	want := minAddrBuckets
	for want < 8*a.n {
		want *= 2
	}
	if len(a.buckets) == want || (len(a.buckets) > want && len(a.buckets) <= 4*want) {
		return
	}
	a.buckets, a.n = make([]uint8, want), 0
	for _, sp := range services {
		a.add(sp.Endpoints, +1)
	}
}

// anyOf reports whether any of the addresses may be counted.
func (a *addrCounts) anyOf(addrs map[netip.Addr]bool) bool {
	for addr := range addrs {
		if *a.bucket(addr) > 0 {
			return true
		}
	}
	return false
}
