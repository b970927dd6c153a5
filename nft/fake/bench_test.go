package fake_test

import (
	"fmt"
	"testing"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/testrules"
	"github.com/nftproxy/nftproxy/nft/fake"
)

// BenchmarkFakeSync: a sync changing one service port's endpoints among n, through
// the real Applier and the fake's parsing and commit checks; and a cold write of 1,000.
func BenchmarkFakeSync(b *testing.B) {
	for _, n := range []int{100, 1000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			cc := compile.NewCompiler(testrules.Config(), compile.NewSlots())
			var sps []model.ServicePort
			for i := range n {
				sps = append(sps, testrules.Service(fmt.Sprintf("s%d", i), fmt.Sprintf("10.96.%d.%d", i/250, 1+i%250), uint16(30000+i), i, 2))
			}
			f := fake.New()
			rs, _ := cc.Compile(&model.Snapshot{Services: model.Ports(sps)})
			if _, err := f.Apply(rs); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := range b.N {
				sps[0] = testrules.Service("s0", "10.96.0.1", 30000, i+1, 1+i%3)
				rs, _ := cc.Compile(&model.Snapshot{Services: model.Ports(sps)})
				if _, err := f.Apply(rs); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("cold1000", func(b *testing.B) {
		var sps []model.ServicePort
		for i := range 1000 {
			sps = append(sps, testrules.Service(fmt.Sprintf("s%d", i), fmt.Sprintf("10.96.%d.%d", i/250, 1+i%250), uint16(30000+i), i, 2))
		}
		cc := compile.NewCompiler(testrules.Config(), compile.NewSlots())
		rs, _ := cc.Compile(&model.Snapshot{Services: model.Ports(sps)})
		for range b.N {
			if _, err := fake.New().Apply(rs); err != nil {
				b.Fatal(err)
			}
		}
	})
}
