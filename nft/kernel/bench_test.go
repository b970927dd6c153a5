package kernel_test

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

// services returns n ClusterIP service ports with eps endpoints each.
func services(n, eps int) []model.ServicePort {
	out := make([]model.ServicePort, n)
	for i := range out {
		s := svc(fmt.Sprintf("s%06d", i), fmt.Sprintf("10.%d.%d.%d", 96+i/65536, (i/256)%256, i%256), 0, 0, 0)
		for j := 0; j < eps; j++ {
			k := i*eps + j
			s.Endpoints = append(s.Endpoints, model.Endpoint{Addr: netip.AddrFrom4([4]byte{10, byte(128 + k/65536), byte(k / 256), byte(k)}), Port: 8080, Ready: true, Serving: true})
		}
		out[i] = s
	}
	return out
}

// BenchmarkColdApply is the first sync of a node: the whole table in one transaction.
func BenchmarkColdApply(b *testing.B) {
	for _, n := range []int{1000, 10000, 30000} {
		b.Run(fmt.Sprintf("services=%d/endpoints=10", n), func(b *testing.B) {
			rs, _ := compile.NewCompiler(cfg(), compile.NewSlots()).Compile(&model.Snapshot{Services: services(n, 10)})
			for b.Loop() {
				b.StopTimer()
				ns := testnetns.New(b)
				a := kernel.New(kernel.WithNetNS(ns.FD))
				b.StartTimer()
				st, err := a.Apply(rs)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(st.Kernel.Milliseconds()), "kernel-ms")
				b.ReportMetric(float64(st.Bytes)/float64(n), "bytes/service")
			}
		})
	}
}

// BenchmarkOneChange is the steady state: one change with n services present; compile +
// diff + kernel write, as the proxy does it (incremental compiler, parts diffed by
// identity). Three kinds of change cost the kernel differently:
//
//   - endpoint-replaced: one endpoint of a service swapped for another (a rolling
//     update's steady pace): set elements only;
//   - endpoint-added: the endpoint count of a service changes (10 <-> 11), so its
//     service chain's rule (numgen random mod N) is replaced;
//   - service-added: a new service: a chain, its rules, a jump in the service map.
//
// A new rule (its dnat, lookup and jump expressions) or a new jump element makes
// nf_tables validate the whole table at commit, walking every chain reachable from the
// base chains: that is the part that grows with n.
func BenchmarkOneChange(b *testing.B) {
	for _, kind := range []string{"endpoint-replaced", "endpoint-added", "service-added"} {
		for _, n := range []int{1000, 10000, 30000} {
			b.Run(fmt.Sprintf("%s/services=%d", kind, n), func(b *testing.B) {
				ns := testnetns.New(b)
				a := kernel.New(kernel.WithNetNS(ns.FD))
				cc := compile.NewCompiler(cfg(), compile.NewSlots())
				snap := &model.Snapshot{Services: services(n, 10)}
				rs, _ := cc.Compile(snap)
				if _, err := a.Apply(rs); err != nil {
					b.Fatal(err)
				}
				var total, worst time.Duration
				msgs := 0
				i := 0
				for b.Loop() {
					i++
					target := &snap.Services[(n/2+i*7919)%n]
					ep := model.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 250, byte(i / 256), byte(i)}), Port: 8080, Ready: true, Serving: true}
					switch kind {
					case "endpoint-replaced":
						eps := slices.Clone(target.Endpoints)
						eps[0] = ep
						target.Endpoints = eps
					case "endpoint-added":
						if len(target.Endpoints) > 10 {
							target.Endpoints = slices.Clone(target.Endpoints[:10])
						} else {
							target.Endpoints = append(slices.Clone(target.Endpoints), ep)
						}
					case "service-added":
						s := svc(fmt.Sprintf("new%06d", i), fmt.Sprintf("10.200.%d.%d", i/256%256, i%256), 0, 0, 0)
						s.Endpoints = []model.Endpoint{ep}
						snap.Services = append(snap.Services, s)
					}
					rs, _ := cc.Compile(snap)
					st, err := a.Apply(rs)
					if err != nil {
						b.Fatal(err)
					}
					total += st.Kernel
					worst = max(worst, st.Kernel)
					msgs = st.Messages
				}
				b.ReportMetric(float64(total.Microseconds())/float64(i), "kernel-µs")
				b.ReportMetric(float64(worst.Microseconds()), "max-kernel-µs")
				b.ReportMetric(float64(msgs), "messages")
			})
		}
	}
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
