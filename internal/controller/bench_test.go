package controller

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/conntrack"
	"github.com/nftproxy/nftproxy/internal/healthcheck"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/nft"
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

// BenchmarkSyncOneChange is the userspace side of a steady-state sync, from API objects:
// n Services with a 10-endpoint EndpointSlice each, one slice replaced (as an informer
// replaces it) per iteration; model, compile (both families), conntrack and health
// check bookkeeping. The kernel write is BenchmarkOneChange in nft/kernel.
func BenchmarkSyncOneChange(b *testing.B) {
	for _, n := range []int{1000, 10000, 30000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			svcs, slices := benchObjects(n)
			cfg := Config{NodeName: "node-1", MasqueradeBit: 14, Limits: compile.DefaultLimits()} // the defaults the proxy runs with
			pl := &pipeline{models: model.NewCache(), slots: map[nft.Family]*compile.Slots{}}
			prev, _, _, err := pl.compile(cfg, svcs, slices, nil)
			if err != nil {
				b.Fatal(err)
			}
			i := 0
			for b.Loop() {
				i++
				k := n / 2
				s := slice(svcs[k].Name, svcs[k].Name+"-1", fmt.Sprintf("10.250.%d.%d", (i/256)%256, i%256))
				slices[k] = s
				snap, _, _, err := pl.compile(cfg, svcs, slices, nil)
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

// BenchmarkSyncAddService is BenchmarkSyncOneChange for a Service added with its
// EndpointSlice per iteration (the bench's expose scenario): arrays sized by the number
// of services grow every time.
func BenchmarkSyncAddService(b *testing.B) {
	for _, n := range []int{1000, 10000, 30000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			svcs, slices := benchObjects(n)
			cfg := Config{NodeName: "node-1", MasqueradeBit: 14, Limits: compile.DefaultLimits()}
			pl := &pipeline{models: model.NewCache(), slots: map[nft.Family]*compile.Slots{}}
			if _, _, _, err := pl.compile(cfg, svcs, slices, nil); err != nil {
				b.Fatal(err)
			}
			i := 0
			for b.Loop() {
				i++
				name := fmt.Sprintf("new%06d", i)
				svcs = append(svcs, service(name, fmt.Sprintf("10.200.%d.%d", (i/256)%256, i%256)))
				slices = append(slices, slice(name, name+"-1", fmt.Sprintf("10.250.%d.%d", (i/256)%256, i%256)))
				if _, _, _, err := pl.compile(cfg, svcs, slices, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
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
			cfg := Config{NodeName: "node-1", MasqueradeBit: 14, Limits: compile.DefaultLimits()} // the defaults the proxy runs with
			var kernelTime time.Duration
			for b.Loop() {
				b.StopTimer()
				ns := testnetns.New(b)
				a := kernel.New(kernel.WithNetNS(ns.FD))
				runtime.GC()
				b.StartTimer()
				pl := &pipeline{models: model.NewCache(), slots: map[nft.Family]*compile.Slots{}}
				_, rulesets, _, err := pl.compile(cfg, svcs, slices, nil)
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
			cfg := Config{NodeName: "node-1", MasqueradeBit: 14, Limits: compile.DefaultLimits()} // the defaults the proxy runs with
			var kept uint64
			for b.Loop() {
				b.StopTimer()
				ns := testnetns.New(b)
				a := kernel.New(kernel.WithNetNS(ns.FD))
				before := liveHeap()
				b.StartTimer()
				pl := &pipeline{models: model.NewCache(), slots: map[nft.Family]*compile.Slots{}}
				_, rulesets, _, err := pl.compile(cfg, svcs, slices, nil)
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
