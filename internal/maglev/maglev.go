// Package maglev builds Maglev lookup tables (Eisenbud et al., "Maglev: A Fast and Reliable
// Software Network Load Balancer", NSDI 2016, section 3.4): a service port with consistent
// hashing picks its endpoint from a table of M entries indexed by a hash of the flow; the
// table is a function of the endpoints alone, so every node builds the same one, and
// removing one of N endpoints moves little more than the 1/N of flows that were on it.
package maglev

import (
	"hash/fnv"
	"slices"
)

// Seed is the seed of the kernel's jhash of a flow's source address and port: one
// constant, so that every node hashes a flow alike.
const Seed = 0x6e667470

// sizes are the table sizes: primes of at least 100 × the endpoints they serve.
// The smallest is 4,093 whatever the endpoints: with fewer entries, Maglev's filling
// moves too many other flows when an endpoint goes (one of ten removed: up to 15 % of
// flows move with 251 entries, 13 % with 1,021, 11 % with 4,093; the 10 % on the removed
// endpoint must move). Each entry is one map element, counted in the table's budget.
var sizes = []int{4093, 8191, 16381}

// MaxSize is the largest table: a port with more than MaxSize/100
// endpoints still gets one, with less even shares (at 1,000 endpoints, 16 or 17 entries
// each).
const MaxSize = 16381

// Size is the table size for n endpoints: the smallest of sizes of at least
// 100 × n, MaxSize beyond.
func Size(n int) int {
	for _, m := range sizes {
		if m >= 100*n {
			return m
		}
	}
	return MaxSize
}

// Table fills a table of m entries (m prime) from the endpoint keys: entry i is
// the index in keys of the endpoint that serves hash bucket i. keys must be distinct;
// their order does not matter (the table is built from them sorted, so two nodes that
// list the same endpoints in another order build the same table). Nil for no keys.
func Table(keys []string, m int) []int {
	if len(keys) == 0 {
		return nil
	}
	order := make([]int, len(keys)) // keys' indices, sorted by key
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		switch {
		case keys[a] < keys[b]:
			return -1
		case keys[a] > keys[b]:
			return 1
		}
		return 0
	})
	offset := make([]uint64, len(keys))
	skip := make([]uint64, len(keys))
	next := make([]uint64, len(keys))
	for j, k := range order {
		offset[j] = hash(keys[k], 0) % uint64(m)
		skip[j] = hash(keys[k], 1)%uint64(m-1) + 1
	}
	table := make([]int, m)
	for i := range table {
		table[i] = -1
	}
	for filled := 0; ; {
		for j, k := range order {
			c := (offset[j] + next[j]*skip[j]) % uint64(m)
			for table[c] >= 0 {
				next[j]++
				c = (offset[j] + next[j]*skip[j]) % uint64(m)
			}
			table[c] = k
			next[j]++
			if filled++; filled == m {
				return table
			}
		}
	}
}

// hash is FNV-1a of a seed byte and s: fixed, so that every node computes the
// same permutations.
func hash(s string, seed byte) uint64 {
	h := fnv.New64a()
	h.Write([]byte{seed})
	h.Write([]byte(s))
	return h.Sum64()
}
