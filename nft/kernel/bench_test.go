package kernel_test

import (
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

// services returns n ClusterIP service ports with eps endpoints each.
func services(n, eps int) []*model.ServicePort {
	out := make([]*model.ServicePort, n)
	for i := range out {
		s := svc(fmt.Sprintf("s%06d", i), fmt.Sprintf("10.%d.%d.%d", 96+i/65536, (i/256)%256, i%256), 0, 0, 0)
		for j := 0; j < eps; j++ {
			k := i*eps + j
			s.Endpoints = append(s.Endpoints, model.Endpoint{Addr: netip.AddrFrom4([4]byte{10, byte(128 + k/65536), byte(k / 256), byte(k)}), Port: 8080, Ready: true, Serving: true})
		}
		out[i] = &s
	}
	return out
}

// benchSize is a benchmark size: n service ports with eps endpoints each.
type benchSize struct{ n, eps int }

func (s benchSize) String() string { return fmt.Sprintf("services=%d/endpoints=%d", s.n, s.eps) }

// benchSizes returns the sizes to run: def, or NFTPROXY_BENCH_SIZES when set, a
// comma-separated list of N or NxE (E endpoints per service, 10 when left out), e.g.
// NFTPROXY_BENCH_SIZES=1000,30000x10,5000x50. The -bench pattern selects among the
// sizes too (e.g. -bench 'OneChange/services=30000/').
func benchSizes(b *testing.B, def []benchSize) []benchSize {
	v := strings.TrimSpace(os.Getenv("NFTPROXY_BENCH_SIZES"))
	if v == "" {
		return def
	}
	var out []benchSize
	for _, f := range strings.Split(v, ",") {
		ns, es, hasE := strings.Cut(strings.ToLower(strings.TrimSpace(f)), "x")
		n, err := strconv.Atoi(ns)
		eps := 10
		if err == nil && hasE {
			eps, err = strconv.Atoi(es)
		}
		if err != nil || n <= 0 || eps <= 0 {
			b.Fatalf("NFTPROXY_BENCH_SIZES=%q: want comma-separated N or NxE, e.g. 1000,50000x5", v)
		}
		out = append(out, benchSize{n, eps})
	}
	return out
}

// BenchmarkColdApply is the first sync of a node: the whole table in one transaction
// (encoding and kernel; the compile is not timed). kernel-ms is the kernel's share.
func BenchmarkColdApply(b *testing.B) {
	for _, size := range benchSizes(b, []benchSize{{1000, 10}, {10000, 10}, {30000, 10}, {50000, 5}, {5000, 50}}) {
		b.Run(size.String(), func(b *testing.B) {
			n := size.n
			rs, _ := compile.NewCompiler(cfg(), compile.NewSlots()).Compile(&model.Snapshot{Services: services(n, size.eps)})
			var kernelTime, kernelCPU time.Duration
			var bytes, ops int
			for b.Loop() {
				b.StopTimer()
				ns := testnetns.New(b)
				a := kernel.New(kernel.WithNetNS(ns.FD))
				b.StartTimer()
				st, err := a.Apply(rs)
				if err != nil {
					b.Fatal(err)
				}
				kernelTime += st.Kernel
				kernelCPU += st.KernelCPU
				bytes = st.Bytes
				ops++
			}
			b.ReportMetric(kernelTime.Seconds()*1000/float64(ops), "kernel-ms")
			b.ReportMetric(kernelCPU.Seconds()*1000/float64(ops), "kernel-cpu-ms")
			b.ReportMetric(float64(bytes)/float64(n), "bytes/service")
		})
	}
}

// BenchmarkIndexMemory is the heap an Applier keeps after a cold apply: its element
// index and state (the ruleset itself is the caller's and is not counted). index-MB is
// the live heap after runtime.GC() with the Applier alive minus the same without it;
// index-bytes/element divides it by the elements applied. It is measured once per size;
// the timed loop is empty.
func BenchmarkIndexMemory(b *testing.B) {
	for _, size := range benchSizes(b, []benchSize{{1000, 10}, {10000, 10}, {30000, 10}}) {
		b.Run(size.String(), func(b *testing.B) {
			rs, _ := compile.NewCompiler(cfg(), compile.NewSlots()).Compile(&model.Snapshot{Services: services(size.n, size.eps)})
			live := func() uint64 {
				var ms runtime.MemStats
				runtime.GC()
				runtime.GC() // the first may leave finalizers' objects behind
				runtime.ReadMemStats(&ms)
				return ms.HeapAlloc
			}
			ns := testnetns.New(b)
			a := kernel.New(kernel.WithNetNS(ns.FD))
			st, err := a.Apply(rs)
			if err != nil {
				b.Fatal(err)
			}
			_ = a.Close()
			with := live()
			runtime.KeepAlive(a)
			without := live()
			retained := with - min(with, without)
			for b.Loop() { // a measure, not a timing: the loop is empty
			}
			runtime.KeepAlive(rs)
			b.ReportMetric(float64(retained)/1e6, "index-MB")
			b.ReportMetric(float64(retained)/float64(st.Elements), "index-bytes/element")
			b.ReportMetric(float64(st.Elements), "elements")
		})
	}
}

// oneChangeKinds are the steady-state changes BenchmarkOneChange makes:
//
//   - endpoint-replaced: one endpoint of a service swapped for another, the count kept
//     (a rolling update's steady pace);
//   - endpoint-count: a service's endpoint count changes, E -> E+1 and back on the next
//     iteration (the same service), so that every iteration changes a count;
//   - service-added: a new service port with E endpoints (removed again, untimed);
//   - service-removed: an existing service port with E endpoints removed (put back,
//     untimed).
var oneChangeKinds = []string{"endpoint-replaced", "endpoint-count", "service-added", "service-removed"}

// BenchmarkOneChange is the steady state: one change with n services present; compile +
// diff + kernel write, as the proxy does it (incremental compiler, parts diffed by
// identity). Each iteration hands the compiler a new snapshot (snapshots are immutable;
// building it is not timed), and the kernel time of every change is kept:
// kernel-ms is the mean, kernel-p50-ms and kernel-p99-ms the quantiles over the changes
// (nearest rank), kernel-max-ms the slowest; kernel-cpu-p50-ms and kernel-cpu-p99-ms are
// the same quantiles of the sending thread's CPU time (Stats.KernelCPU), which leaves
// out waits for a core: the benchmark's own garbage collection makes wall-time tails of
// several ms at 30k (none with GOGC=off) that are no kernel work. When the timed loop made fewer than
// NFTPROXY_BENCH_SAMPLES changes (default 100: at tens of ms per change the default
// -benchtime=1s makes a dozen), more are made after it, untimed, for the quantiles.
// Which ruleset shape is measured is whatever the compiler produces.
//
// Sizes: 1k, 10k, 30k × 10 endpoints and 50k × 5 for every kind; 5k × 50 for the
// endpoint changes (NFTPROXY_BENCH_SIZES overrides the sizes, every kind then runs).
// Setup (compile and first apply) is once per size; the kinds run on it in turn.
//
// With a ruleset that has a chain and rules per service, a new rule (its dnat, lookup and
// jump expressions) or a new jump element makes nf_tables validate the whole table at
// commit, walking every chain reachable from the base chains: that is the part that grows
// with n (docs/bench/notebook.md, "What stands in the way", kernel validation).
func BenchmarkOneChange(b *testing.B) {
	def := []benchSize{{1000, 10}, {10000, 10}, {30000, 10}, {50000, 5}, {5000, 50}}
	_, custom := os.LookupEnv("NFTPROXY_BENCH_SIZES")
	minSamples := 100
	if v := os.Getenv("NFTPROXY_BENCH_SAMPLES"); v != "" {
		var err error
		if minSamples, err = strconv.Atoi(v); err != nil || minSamples < 0 {
			b.Fatalf("NFTPROXY_BENCH_SAMPLES=%q: want a count", v)
		}
	}
	for _, size := range benchSizes(b, def) {
		b.Run(size.String(), func(b *testing.B) {
			kinds := oneChangeKinds
			if !custom && size.eps > 10 {
				kinds = kinds[:2] // many endpoints per service: the endpoint changes (as in the 5k × 50 bench)
			}
			oc := newOneChange(b, size)
			for _, kind := range kinds {
				b.Run(kind, func(b *testing.B) { oc.run(b, kind, minSamples) })
			}
		})
	}
}

// oneChange is one size's table, programmed in a namespace, and the compiler that made it.
type oneChange struct {
	size benchSize
	a    *kernel.Applier
	cc   *compile.Compiler
	snap *model.Snapshot
	seq  int // changes made so far (fresh names and addresses)
}

func newOneChange(b *testing.B, size benchSize) *oneChange {
	ns := testnetns.New(b)
	oc := &oneChange{size: size, a: kernel.New(kernel.WithNetNS(ns.FD)), cc: compile.NewCompiler(cfg(), compile.NewSlots()),
		snap: &model.Snapshot{Services: services(size.n, size.eps)}}
	if _, err := oc.apply(b, oc.snap); err != nil {
		b.Fatal(err)
	}
	return oc
}

// apply compiles snap and applies it; snap is the current snapshot from then on.
func (oc *oneChange) apply(b *testing.B, snap *model.Snapshot) (kernel.Stats, error) {
	rs, problems := oc.cc.Compile(snap)
	if len(problems) > 0 {
		b.Fatalf("compile: %v", problems)
	}
	st, err := oc.a.Apply(rs)
	oc.snap = snap
	return st, err
}

// freshEndpoint is an endpoint address no bulk service has (10.128.0.0/11 are theirs).
func freshEndpoint(k int) model.Endpoint {
	return model.Endpoint{Addr: netip.AddrFrom4([4]byte{10, byte(200 + (k>>16)%48), byte(k >> 8), byte(k)}), Port: 8080, Ready: true, Serving: true}
}

// with returns a new snapshot: the current one with service i replaced by sp.
func (oc *oneChange) with(i int, sp *model.ServicePort) *model.Snapshot {
	svcs := slices.Clone(oc.snap.Services)
	svcs[i] = sp
	return &model.Snapshot{Services: svcs}
}

// change returns the snapshot of one change of kind (iteration i) and, for kinds that
// are undone after each change, the snapshot that undoes it.
func (oc *oneChange) change(kind string, i int) (do, undo *model.Snapshot) {
	n, e := oc.size.n, oc.size.eps
	cur := oc.snap
	oc.seq++
	switch kind {
	case "endpoint-replaced":
		t := (n/2 + i*7919) % n
		sp := new(*cur.Services[t]) // service ports are never modified: change a copy
		eps := slices.Clone(sp.Endpoints)
		eps[i%len(eps)] = freshEndpoint(oc.seq)
		sp.Endpoints = eps
		return oc.with(t, sp), nil
	case "endpoint-count":
		// pairs of iterations on one service: E -> E+1, then E+1 -> E
		t := (n/2 + (i/2)*7919) % n
		sp := new(*cur.Services[t]) // service ports are never modified: change a copy
		if len(sp.Endpoints) > e {
			sp.Endpoints = slices.Clone(sp.Endpoints[:e])
		} else {
			sp.Endpoints = append(slices.Clone(sp.Endpoints), freshEndpoint(oc.seq))
		}
		return oc.with(t, sp), nil
	case "service-added":
		// named after every bulk service ("s…" < "t…"): appended keeps the order by name
		sp := svc(fmt.Sprintf("t%06d", oc.seq), fmt.Sprintf("10.99.%d.%d", (oc.seq/256)%256, oc.seq%256), 0, 0, 0)
		for j := range e {
			sp.Endpoints = append(sp.Endpoints, freshEndpoint(oc.seq*e+j))
		}
		return &model.Snapshot{Services: append(slices.Clip(cur.Services), &sp)}, cur
	case "service-removed":
		t := (n/2 + i*7919) % n
		return &model.Snapshot{Services: slices.Delete(slices.Clone(cur.Services), t, t+1)}, cur
	}
	panic("unknown kind " + kind)
}

func (oc *oneChange) run(b *testing.B, kind string, minSamples int) {
	var kernelTimes, cpuTimes []time.Duration
	var msgs, elems, chains int
	i := 0
	step := func(timed bool) {
		if timed {
			b.StopTimer()
		}
		do, undo := oc.change(kind, i)
		i++
		if timed {
			b.StartTimer()
		}
		st, err := oc.apply(b, do)
		if err != nil {
			b.Fatalf("%s %d: %v", kind, i, err)
		}
		if timed {
			b.StopTimer()
		}
		kernelTimes, cpuTimes = append(kernelTimes, st.Kernel), append(cpuTimes, st.KernelCPU)
		msgs, elems, chains = msgs+st.Messages, elems+st.Elements, chains+st.Chains
		if undo != nil {
			if _, err := oc.apply(b, undo); err != nil {
				b.Fatalf("%s %d: undo: %v", kind, i, err)
			}
		}
		if timed {
			b.StartTimer()
		}
	}
	for b.Loop() {
		step(true)
	}
	for len(kernelTimes) < minSamples {
		step(false)
	}
	if kind == "endpoint-count" && i%2 == 1 {
		// the last service is at E+1: put it back for the kinds after this one
		if _, err := oc.apply(b, func() *model.Snapshot { s, _ := oc.change(kind, i); return s }()); err != nil {
			b.Fatal(err)
		}
	}
	slices.Sort(kernelTimes)
	slices.Sort(cpuTimes)
	quantile := func(ds []time.Duration, p float64) float64 { // nearest rank
		r := int(p*float64(len(ds))+0.999999) - 1
		return ds[min(max(r, 0), len(ds)-1)].Seconds() * 1000
	}
	q := func(p float64) float64 { return quantile(kernelTimes, p) }
	var sum time.Duration
	for _, d := range kernelTimes {
		sum += d
	}
	k := float64(len(kernelTimes))
	b.ReportMetric(sum.Seconds()*1000/k, "kernel-ms")
	b.ReportMetric(q(0.50), "kernel-p50-ms")
	b.ReportMetric(q(0.99), "kernel-p99-ms")
	b.ReportMetric(kernelTimes[len(kernelTimes)-1].Seconds()*1000, "kernel-max-ms")
	b.ReportMetric(quantile(cpuTimes, 0.50), "kernel-cpu-p50-ms")
	b.ReportMetric(quantile(cpuTimes, 0.99), "kernel-cpu-p99-ms")
	b.ReportMetric(k, "changes")
	b.ReportMetric(float64(msgs)/k, "messages/change")
	b.ReportMetric(float64(elems)/k, "elements/change")
	b.ReportMetric(float64(chains)/k, "chains/change")
}

// BenchmarkCounterRead is one read of the per-service counters at 20,000 services (one
// element each in service-counters; IPv4): CountersByOwner (by element key, as
// /metrics reads them) and, for comparison, SetCounts (the element dump
// with comments, as /metrics read them until the counters were keyed by service port).
// With the ServiceCounters cache, a read happens at most once per interval whatever
// the number of scrapes.
func BenchmarkCounterRead(b *testing.B) {
	const n = 20000
	ns := testnetns.New(b)
	rs, _ := compile.NewCompiler(cfg(), compile.NewSlots()).Compile(&model.Snapshot{Services: services(n, 1)})
	a := kernel.New(kernel.WithNetNS(ns.FD))
	if _, err := a.Apply(rs); err != nil {
		b.Fatal(err)
	}
	b.Run("CountersByOwner", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			counts, unattributed, err := a.CountersByOwner(cfg().Family, compile.TableName, compile.SetServiceCounters, compile.SetNodePortCounters)
			if err != nil || len(counts) != n || unattributed != 0 {
				b.Fatalf("%d counts, %d unattributed: %v", len(counts), unattributed, err)
			}
		}
	})
	b.Run("SetCounts", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			for _, set := range []string{compile.SetServiceCounters, compile.SetNodePortCounters} {
				if _, err := a.SetCounts(cfg().Family, compile.TableName, set); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}
