package compile

import (
	"sort"

	"github.com/nftproxy/nftproxy/internal/model"
)

// slotBlock is the allocation unit of endpoint slots. A service port with n endpoints owns
// ceil(n/slotBlock) consecutive blocks of the endpoint slot space.
const slotBlock = 16

// pageBlocks is the number of blocks in one page. Each page of slots is its own endpoints
// map: the kernel walks every element of a map each time a rule binds it, so one map
// shared by all services would make programming quadratic. A range of up to one page
// never straddles two; a larger range starts on a page boundary and has its pages to
// itself.
const pageBlocks = 16

// PageSlots is the number of slots in one endpoints map.
const PageSlots = slotBlock * pageBlocks

// Slots assigns every service port a stable range of keys in the shared endpoints map, so
// that "numgen random mod n offset base" picks one of its endpoints. Ranges survive across
// syncs: adding or removing one service never renumbers the others, which keeps the
// per-sync kernel delta proportional to what changed. It is the compiler's only state and
// is passed in explicitly.
type Slots struct {
	owned map[model.ServicePortName]slotRange
	free  []slotRange // sorted by start, non-adjacent
	next  uint32      // first never-used block
	// treeBits is the depth of the flat path's endpoint-count trees (flat.go): it grows
	// with the largest flat endpoint count ever compiled and never shrinks, so that a
	// count that goes back and forth across a power of two does not rebuild the trees.
	treeBits int
}

type slotRange struct{ start, blocks uint32 }

// NewSlots returns an empty allocator.
func NewSlots() *Slots {
	return &Slots{owned: map[model.ServicePortName]slotRange{}}
}

// base returns the first key of the range of sp, (re)allocating it when n endpoints do not
// fit.
func (s *Slots) base(sp model.ServicePortName, n int) uint32 {
	need := uint32((n + slotBlock - 1) / slotBlock)
	if need == 0 {
		need = 1
	}
	if r, ok := s.owned[sp]; ok {
		if r.blocks >= need && r.blocks <= 4*need {
			return r.start * slotBlock
		}
		s.release(r)
	}
	r := s.take(need)
	s.owned[sp] = r
	return r.start * slotBlock
}

// drop frees the ranges of the given owners.
func (s *Slots) drop(owners []model.ServicePortName) {
	for _, o := range owners {
		if r, ok := s.owned[o]; ok {
			s.release(r)
			delete(s.owned, o)
		}
	}
}

// retain frees the ranges of every service port not in keep.
func (s *Slots) retain(keep map[model.ServicePortName]bool) {
	for sp, r := range s.owned {
		if !keep[sp] {
			s.release(r)
			delete(s.owned, sp)
		}
	}
}

func (s *Slots) take(blocks uint32) slotRange {
	for i, f := range s.free {
		start := alignFor(f.start, blocks)
		if start+blocks > f.start+f.blocks {
			continue
		}
		// carve [start, start+blocks) out of f
		var rest []slotRange
		if start > f.start {
			rest = append(rest, slotRange{f.start, start - f.start})
		}
		if end := f.start + f.blocks; start+blocks < end {
			rest = append(rest, slotRange{start + blocks, end - start - blocks})
		}
		s.free = append(s.free[:i], append(rest, s.free[i+1:]...)...)
		return slotRange{start, blocks}
	}
	start := alignFor(s.next, blocks)
	if start > s.next {
		s.free = append(s.free, slotRange{s.next, start - s.next})
	}
	s.next = start + blocks
	return slotRange{start, blocks}
}

// alignFor returns the first block at or after b where a range of n blocks fits the page
// rule.
func alignFor(b, n uint32) uint32 {
	if n <= pageBlocks && b%pageBlocks+n <= pageBlocks {
		return b
	}
	return (b + pageBlocks - 1) / pageBlocks * pageBlocks
}

func (s *Slots) release(r slotRange) {
	i := sort.Search(len(s.free), func(i int) bool { return s.free[i].start > r.start })
	s.free = append(s.free, slotRange{})
	copy(s.free[i+1:], s.free[i:])
	s.free[i] = r
	// merge with neighbours
	if i+1 < len(s.free) && s.free[i].start+s.free[i].blocks == s.free[i+1].start {
		s.free[i].blocks += s.free[i+1].blocks
		s.free = append(s.free[:i+1], s.free[i+2:]...)
	}
	if i > 0 && s.free[i-1].start+s.free[i-1].blocks == s.free[i].start {
		s.free[i-1].blocks += s.free[i].blocks
		s.free = append(s.free[:i], s.free[i+1:]...)
	}
	// give a trailing free range back to the never-used area
	if n := len(s.free); n > 0 && s.free[n-1].start+s.free[n-1].blocks == s.next {
		s.next = s.free[n-1].start
		s.free = s.free[:n-1]
	}
}
