package model

import (
	"slices"
	"strings"
)

// Changes is what a snapshot says about how it differs from the one built before it by
// the same Cache: the services whose ports were built again. It is the contract between
// the model cache and the incremental compiler, which would otherwise find the changes
// again by comparing every service port with its previous input:
//
//   - a service port of a service not in the set is, field for field, the one of the
//     previous snapshot (the cache copies the same values: its slices are the same
//     arrays);
//   - a service port of a service in the set may differ, or may be equal (an object
//     replaced without a change in what the model reads): the reader compares it.
//
// The set only speaks for the snapshot built immediately before (Follows). A snapshot
// built by BuildFrom, or the first of a Cache, follows nothing: everything may differ.
type Changes struct {
	cache   *Cache   // nil: not built by a cache
	gen     uint64   // the cache's build that made the snapshot
	rebuilt []nsName // sorted: a sync rebuilds a few services, and a lookup in a short
	// sorted list costs less than hashing the name of each of 30,000 service ports
}

// Follows reports whether c describes the changes since the snapshot whose Changes are
// prev: both come from the same Cache, one build after the other.
func (c Changes) Follows(prev Changes) bool {
	return c.cache != nil && c.cache == prev.cache && c.gen == prev.gen+1
}

// MayDiffer reports whether the ports of sp's service were built again, and so may
// differ from the previous snapshot's. Only meaningful when Follows holds.
func (c Changes) MayDiffer(sp ServicePortName) bool {
	if len(c.rebuilt) == 0 {
		return false
	}
	_, found := slices.BinarySearchFunc(c.rebuilt, nsName{sp.Namespace, sp.Name}, compareNames)
	return found
}

func compareNames(a, b nsName) int {
	if r := strings.Compare(a.ns, b.ns); r != 0 {
		return r
	}
	return strings.Compare(a.name, b.name)
}
