package main

import "runtime/debug"

// nftproxy's memory policy (for a fast cold start and a peak RSS at most half of
// kube-proxy's), unless GOGC is set, which overrides all of it. It has
// three phases:
//
//  1. While the informers list everything: GOGC=coldGCPercent. The lists' garbage is
//     about the size of the caches they fill, and the process peaks during the cold
//     start; collecting at +30% rather than +50% lowers that peak (30k services × 10:
//     392 MiB) for some cold-start CPU. With it, unless GOMEMLIMIT is set (the limit
//     would count it), a ballast of listBallastSize: the heap grows from nothing then,
//     and at +30% the collector would run every few megabytes at first, each run
//     marking all that was kept so far and making the decoding goroutines assist it.
//     The ballast is a pointer-free array that is allocated and never written, so its
//     pages are never touched (it costs no RSS), but the collector counts it: the first
//     collections wait until the heap is that much larger (10,000 services × 10: the
//     informers synced in 0.28–0.31 s instead of 0.36–0.51 s).
//  2. The first sync (cachesSynced, called before it): the ballast is dropped and one
//     collection returns the lists' garbage to the system (debug.FreeOSMemory), so the
//     first sync starts from the caches alone. It then runs at
//     GOGC=firstSyncGCPercent: what it allocates (model, compiled parts, the applier's
//     index and the encoded transaction, 1.6 times the caches' heap at 10,000 × 10) is
//     mostly kept, so a collection during it marks a growing heap and frees little; at
//     +30% there were five. At +120% the heap may more than double before one.
//     +200% (once a sixth faster than +30% for the first sync) was no
//     faster than +120% once the lists were streamed (internal/source/listing.go),
//     and its peak was 3–6 MiB higher at 10,000 × 10 (figures in docs/bench/notebook.md).
//  3. After the first sync (firstSyncDone): one forced collection returns the cold
//     start's free pages to the system (otherwise the runtime keeps them resident for
//     minutes), and GOGC=steadyGCPercent from then on. A sync allocates little (1.3 MB
//     at 30k, one change), so collecting at +10% means a collection every few dozen
//     syncs: under the bench's 50 writes/s at 10k, 3.5 s of CPU a minute against 2.5 s
//     at +25%, and a third of kube-proxy's 11.4 s.
const (
	coldGCPercent      = 30
	firstSyncGCPercent = 120
	steadyGCPercent    = 10
	listBallastSize    = 32 << 20
)

// memoryPolicy is the policy's state between its phases.
type memoryPolicy struct {
	ballast []byte // phase 1 only
}

// startMemoryPolicy starts phase 1 and returns the policy, or nil when GOGC is set
// (getenv reads the environment).
func startMemoryPolicy(getenv func(string) string) *memoryPolicy {
	if getenv("GOGC") != "" {
		return nil
	}
	debug.SetGCPercent(coldGCPercent)
	m := &memoryPolicy{}
	if getenv("GOMEMLIMIT") == "" {
		m.ballast = make([]byte, listBallastSize)
	}
	return m
}

// cachesSynced starts phase 2, before the first sync.
func (m *memoryPolicy) cachesSynced() {
	m.ballast = nil
	debug.FreeOSMemory()
	debug.SetGCPercent(firstSyncGCPercent)
}

// firstSyncDone starts phase 3, once the first sync has programmed the kernel.
func (m *memoryPolicy) firstSyncDone() {
	debug.SetGCPercent(steadyGCPercent)
	debug.FreeOSMemory()
}
