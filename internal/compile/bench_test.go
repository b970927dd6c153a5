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
