package kernel_test

import (
	"fmt"
	"net/netip"
	"testing"

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

// BenchmarkOneChange is the steady state: one endpoint added to one service with n
// services present; compile + diff + kernel write, as the proxy does it (incremental
// compiler, parts diffed by identity).
func BenchmarkOneChange(b *testing.B) {
	for _, n := range []int{1000, 10000, 30000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			ns := testnetns.New(b)
			a := kernel.New(kernel.WithNetNS(ns.FD))
			cc := compile.NewCompiler(cfg(), compile.NewSlots())
			snap := &model.Snapshot{Services: services(n, 10)}
			rs, _ := cc.Compile(snap)
			if _, err := a.Apply(rs); err != nil {
				b.Fatal(err)
			}
			target := &snap.Services[n/2]
			base := target.Endpoints
			i := 0
			for b.Loop() {
				i++
				target.Endpoints = append(base[:10:10], model.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 250, byte(i / 256), byte(i)}), Port: 8080, Ready: true, Serving: true})
				rs, _ := cc.Compile(snap)
				st, err := a.Apply(rs)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(st.Kernel.Microseconds()), "kernel-µs")
				b.ReportMetric(float64(st.Messages), "messages")
			}
		})
	}
}
