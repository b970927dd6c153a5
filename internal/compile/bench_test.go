package compile

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/nftproxy/nftproxy/internal/model"
)

// BenchmarkCompile measures the pure compile step for n services with 10 endpoints.
func BenchmarkCompile(b *testing.B) {
	for _, n := range []int{1000, 10000, 30000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			snap := &model.Snapshot{}
			for i := 0; i < n; i++ {
				sp := model.ServicePort{
					Name:       model.ServicePortName{Namespace: "bench", Name: fmt.Sprintf("s%06d", i), Port: "http", Protocol: model.ProtoTCP},
					ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, byte(96 + i/65536), byte(i / 256), byte(i)})},
					Port:       80,
				}
				for j := 0; j < 10; j++ {
					k := i*10 + j
					sp.Endpoints = append(sp.Endpoints, model.Endpoint{Addr: netip.AddrFrom4([4]byte{10, byte(128 + k/65536), byte(k / 256), byte(k)}), Port: 8080, Ready: true, Serving: true})
				}
				snap.Services = append(snap.Services, &sp)
			}
			slots := NewSlots()
			for b.Loop() {
				Compile(snap, testConfig(), slots)
			}
		})
	}
}

// BenchmarkClaimsOneAddress is a tenant's n Services all claiming one external IP and
// port: a fresh compile orders the claimants once (n log n), not one insertion each
// into an ever longer list (n²); one more claimant then costs a search and a move.
func BenchmarkClaimsOneAddress(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("claimants=%d", n), func(b *testing.B) {
			snap := &model.Snapshot{}
			for i := range n {
				snap.Services = append(snap.Services, &model.ServicePort{
					Name:        model.ServicePortName{Namespace: "tenant", Name: fmt.Sprintf("s%06d", i), Port: "http", Protocol: model.ProtoTCP},
					ClusterIPs:  []netip.Addr{netip.AddrFrom4([4]byte{10, byte(96 + i/65536), byte(i / 256), byte(i)})},
					Port:        80,
					ExternalIPs: []netip.Addr{netip.MustParseAddr("203.0.113.7")},
				})
			}
			for b.Loop() {
				if _, problems := Compile(snap, testConfig(), NewSlots()); len(problems) != n-1 {
					b.Fatalf("%d problems, want %d (every claimant but the first loses)", len(problems), n-1)
				}
			}
		})
	}
}
