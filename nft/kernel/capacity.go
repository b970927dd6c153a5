package kernel

import (
	"fmt"

	"github.com/nftproxy/nftproxy/nft"
)

// Set capacity. A set created without a size is a resizable hash table in the kernel
// (rhashtable): filled with 100,000 endpoint entries in one transaction it doubles
// about fifteen times, and while it doubles every insertion takes the slow path; that
// was half of the kernel's time on a 10,000-service cold start. Given a size
// (NFTA_SET_DESC_SIZE), the kernel picks a hash table with a fixed number of buckets
// for it (more than the size, so lookups stay O(1)) and refuses elements beyond the
// size (ENFILE).
//
// So a full write (the first sync, a resync, the hourly rewrite) gives each of the
// ruleset's own sets that holds at least presizeMin elements a capacity of half as
// much again as it holds. The sets a sync may fill are never near their capacity
// unnoticed: a sync that would take a set past it is not sent; the whole table is
// written anew instead, with that set unsized (resizable, as every set was before) until
// the next full write sizes it again. A tenant who keeps adding endpoints thus costs
// every node one full write per set until the next full rewrite (FullSyncPeriod in the
// controller), not one per sync. Dynamic sets keep the size their definition gives.
const presizeMin = 1024

// capacityFor is the size a full write gives a set holding n elements.
func capacityFor(n int) uint32 { return uint32(n + n/2) }

// withCapacity returns s to be created with capacity c (s itself when c is 0 or s has
// its own size).
func withCapacity(s *nft.Set, c uint32) *nft.Set {
	if c == 0 || s.Size != 0 {
		return s
	}
	sized := *s
	sized.Size = c
	return &sized
}

// overCapacity is a sync that would take a set past the capacity it was created with.
type overCapacity struct {
	set      string
	n        int
	capacity uint32
}

func (e *overCapacity) Error() string {
	return fmt.Sprintf("set %s would hold %d elements, over its capacity %d", e.set, e.n, e.capacity)
}

// checkCapacity reports the first touched set of st that holds more elements than its
// capacity.
func checkCapacity(st *state, touched map[string]map[string]*refElem) *overCapacity {
	for name := range touched {
		c := st.caps[name]
		if c == 0 {
			continue
		}
		if m := st.elems[name]; m != nil && m.len() > int(c) {
			return &overCapacity{set: name, n: m.len(), capacity: c}
		}
	}
	return nil
}
