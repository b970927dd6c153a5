package controller

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/nftproxy/nftproxy/internal/admit"
	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/conntrack"
	"github.com/nftproxy/nftproxy/internal/healthcheck"
	"github.com/nftproxy/nftproxy/internal/metrics"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/pipeline"
	"github.com/nftproxy/nftproxy/internal/source"
	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

// benchObjects returns n Services with a 10-endpoint EndpointSlice each.
func benchObjects(n int) ([]*v1.Service, []*discovery.EndpointSlice) {
	svcs := make([]*v1.Service, n)
	slices := make([]*discovery.EndpointSlice, n)
	for i := range svcs {
		name := fmt.Sprintf("s%06d", i)
		svcs[i] = service(name, fmt.Sprintf("10.%d.%d.%d", 96+i/65536, (i/256)%256, i%256))
		var addrs []string
		for j := range 10 {
			k := i*10 + j
			addrs = append(addrs, fmt.Sprintf("10.%d.%d.%d", 128+k/65536, (k/256)%256, k%256))
		}
		slices[i] = slice(name, name+"-1", addrs...)
	}
	return svcs, slices
}

// benchProxy is the part of a Proxy that a sync's userspace work goes through: listers
// over informer-like stores, the pending names the event handlers note, the pipeline.
type benchProxy struct {
	p                    *Proxy
	svcStore, sliceStore cache.Indexer
	// lists: each sync lists the stores and builds from the full lists, as the proxy
	// did before it noted names (the comparison for the changes path)
	lists bool
}

func newBenchProxy(b testing.TB, svcs []*v1.Service, slices []*discovery.EndpointSlice, lists bool) *benchProxy {
	newStore := func() cache.Indexer {
		return cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	}
	bp := &benchProxy{svcStore: newStore(), sliceStore: newStore(), lists: lists}
	for _, s := range svcs {
		_ = bp.svcStore.Add(s)
	}
	for _, s := range slices {
		_ = bp.sliceStore.Add(s)
	}
	cfg := Config{NodeName: "node-1", Metrics: metrics.Nop{}, Pipeline: pipeline.Config{Compile: compile.Config{MasqueradeBit: 14, Policy: admit.Policy{Limits: admit.DefaultLimits()}}}} // the defaults the proxy runs with
	src := source.NewFromStores(source.Config{NodeName: cfg.NodeName}, bp.svcStore, bp.sliceStore, newStore(), logr.Discard())
	bp.p = &Proxy{cfg: cfg, log: logr.Discard(), reported: map[model.Problem]bool{}, src: src, lists: src.Lists,
		pipeline: pipeline.New()}
	if _, err := bp.sync(); err != nil { // the first sync: full lists
		b.Fatal(err)
	}
	return bp
}

// update puts obj in its store and notes its name, as an informer and the event
// handler do.
func (bp *benchProxy) update(obj any) {
	switch obj.(type) {
	case *v1.Service:
		_ = bp.svcStore.Update(obj)
		bp.p.src.Add(source.Services, obj, false)
	case *discovery.EndpointSlice:
		_ = bp.sliceStore.Update(obj)
		bp.p.src.Add(source.EndpointSlices, obj, false)
	}
}

// sync builds and compiles the snapshot, as Proxy.sync before it writes to the kernel.
func (bp *benchProxy) sync() (*model.Snapshot, error) {
	c := bp.p.src.Take()
	if !bp.lists {
		snap, _, err := bp.p.compile(&c)
		return snap, err
	}
	svcs, slices, err := bp.p.src.Lists()
	if err != nil {
		return nil, err
	}
	snap, _, problems, err := bp.p.pipeline.Full(bp.p.cfg.Pipeline, svcs, slices, nil)
	bp.p.report(problems)
	return snap, err
}

// syncPaths are the two ways a sync gets its objects: the names changed since the last
// one (the proxy's), and the full lists (the proxy's before).
var syncPaths = []struct {
	name  string
	lists bool
}{{"changes", false}, {"lists", true}}

// BenchmarkSyncOneChange is the userspace side of a steady-state sync, from API objects:
// n Services with a 10-endpoint EndpointSlice each, one slice replaced (as an informer
// replaces it) per iteration; the objects from the informer-like stores, model, compile
// (both families), conntrack and health check bookkeeping. The kernel write is
// BenchmarkOneChange in nft/kernel.
func BenchmarkSyncOneChange(b *testing.B) {
	for _, n := range []int{1000, 10000, 30000} {
		for _, path := range syncPaths {
			b.Run(fmt.Sprintf("services=%d/%s", n, path.name), func(b *testing.B) {
				svcs, slices := benchObjects(n)
				bp := newBenchProxy(b, svcs, slices, path.lists)
				prev, err := bp.sync()
				if err != nil {
					b.Fatal(err)
				}
				i := 0
				for b.Loop() {
					i++
					k := n / 2
					bp.update(slice(svcs[k].Name, svcs[k].Name+"-1", fmt.Sprintf("10.250.%d.%d", (i/256)%256, i%256)))
					snap, err := bp.sync()
					if err != nil {
						b.Fatal(err)
					}
					conntrack.StaleWith(prev, snap, conntrack.Serving)
					healthcheck.FromSnapshot(snap)
					prev = snap
				}
			})
		}
	}
}

// BenchmarkSyncAddService is BenchmarkSyncOneChange for a Service added with its
// EndpointSlice per iteration (the bench's expose scenario): arrays sized by the number
// of services grow every time.
func BenchmarkSyncAddService(b *testing.B) {
	for _, n := range []int{1000, 10000, 30000} {
		for _, path := range syncPaths {
			b.Run(fmt.Sprintf("services=%d/%s", n, path.name), func(b *testing.B) {
				svcs, slices := benchObjects(n)
				bp := newBenchProxy(b, svcs, slices, path.lists)
				i := 0
				for b.Loop() {
					i++
					name := fmt.Sprintf("new%06d", i)
					bp.update(service(name, fmt.Sprintf("10.200.%d.%d", (i/256)%256, i%256)))
					bp.update(slice(name, name+"-1", fmt.Sprintf("10.250.%d.%d", (i/256)%256, i%256)))
					if _, err := bp.sync(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkColdSync is the dataplane part of a cold start, in process: from the
// informers' API objects (n Services with a 10-endpoint EndpointSlice each) to both
// families' tables programmed in a throwaway network namespace: model, compile, encode
// and the kernel's transaction. Needs root (NFTPROXY_KERNEL_TESTS=1).
func BenchmarkColdSync(b *testing.B) {
	for _, n := range []int{1000, 10000, 30000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			svcs, slices := benchObjects(n)
			cfg := Config{NodeName: "node-1", Pipeline: pipeline.Config{Compile: compile.Config{MasqueradeBit: 14, Policy: admit.Policy{Limits: admit.DefaultLimits()}}}} // the defaults the proxy runs with
			var kernelTime time.Duration
			for b.Loop() {
				b.StopTimer()
				ns := testnetns.New(b)
				a := kernel.New(kernel.WithNetNS(ns.FD))
				runtime.GC()
				b.StartTimer()
				pl := pipeline.New()
				_, rulesets, _, err := pl.Full(cfg.Pipeline, svcs, slices, nil)
				if err != nil {
					b.Fatal(err)
				}
				st, err := a.Apply(rulesets...)
				if err != nil {
					b.Fatal(err)
				}
				kernelTime += st.Kernel
			}
			b.ReportMetric(float64(kernelTime.Milliseconds())/float64(b.N), "kernel-ms")
		})
	}
}

// BenchmarkColdSyncHeap is the heap a Proxy's pipeline and applier keep after a cold
// sync (the API objects excluded), per service: model, compiled parts and the applier's
// index, the memory nftproxy adds to its informers' caches. Needs root
// (NFTPROXY_KERNEL_TESTS=1).
func BenchmarkColdSyncHeap(b *testing.B) {
	for _, n := range []int{1000, 10000, 30000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			svcs, slices := benchObjects(n)
			cfg := Config{NodeName: "node-1", Pipeline: pipeline.Config{Compile: compile.Config{MasqueradeBit: 14, Policy: admit.Policy{Limits: admit.DefaultLimits()}}}} // the defaults the proxy runs with
			var kept uint64
			for b.Loop() {
				b.StopTimer()
				ns := testnetns.New(b)
				a := kernel.New(kernel.WithNetNS(ns.FD))
				before := liveHeap()
				b.StartTimer()
				pl := pipeline.New()
				_, rulesets, _, err := pl.Full(cfg.Pipeline, svcs, slices, nil)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := a.Apply(rulesets...); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				kept = liveHeap() - before
				runtime.KeepAlive(pl)
				runtime.KeepAlive(a)
				b.StartTimer()
			}
			b.ReportMetric(float64(kept)/(1<<20), "live-MB")
			b.ReportMetric(float64(kept)/float64(n), "live-bytes/service")
		})
	}
}

// liveHeap is the heap in use after a collection.
func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}
