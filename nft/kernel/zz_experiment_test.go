package kernel_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

func TestZZExperiment(t *testing.T) {
	if os.Getenv("ZZ") == "" {
		t.Skip()
	}
	n := 30000
	ns := testnetns.New(t)
	a := kernel.New(kernel.WithNetNS(ns.FD))
	cc := compile.NewCompiler(cfg(), compile.NewSlots())
	snap := &model.Snapshot{Services: services(n, 10)}
	rs, _ := cc.Compile(snap)
	st, err := a.Apply(rs)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cold kernel %v", st.Kernel)
	i := 0
	run := func(label string, kind string) {
		var ks []time.Duration
		for r := 0; r < 12; r++ {
			i++
			target := &snap.Services[(n/2+i*7)%n]
			switch kind {
			case "swap": // same count, one endpoint replaced
				eps := append([]model.Endpoint(nil), target.Endpoints...)
				eps[0].Addr = netip.AddrFrom4([4]byte{10, 250, byte(i / 256), byte(i)})
				target.Endpoints = eps
			case "add": // count changes
				eps := append([]model.Endpoint(nil), target.Endpoints...)
				eps = append(eps, model.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 251, byte(i / 256), byte(i)}), Port: 8080, Ready: true, Serving: true})
				target.Endpoints = eps
			case "svc": // new service
				s := svc(fmt.Sprintf("new%06d", i), fmt.Sprintf("10.200.%d.%d", i/256, i%256), 0, 0, 0)
				s.Endpoints = []model.Endpoint{{Addr: netip.AddrFrom4([4]byte{10, 252, byte(i / 256), byte(i)}), Port: 8080, Ready: true, Serving: true}}
				snap.Services = append(snap.Services, s)
			}
			rs, _ := cc.Compile(snap)
			st, err := a.Apply(rs)
			if err != nil {
				t.Fatal(err)
			}
			ks = append(ks, st.Kernel)
		}
		sort.Slice(ks, func(x, y int) bool { return ks[x] < ks[y] })
		t.Logf("%-30s kind=%-5s min %v p50 %v max %v", label, kind, ks[0], ks[len(ks)/2], ks[len(ks)-1])
	}
	for _, k := range []string{"swap", "add", "svc"} {
		run("no listener", k)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := kernel.NewMonitor([]kernel.TableID{{Family: nft.IPv4, Name: rs.Table}}, func(kernel.Change) {}, kernel.MonitorNetNS(ns.FD))
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"swap", "add", "svc"} {
		run("monitor", k)
	}
	cancel()
	<-m.Done()
	for _, k := range []string{"swap", "add", "svc"} {
		run("monitor gone", k)
	}
}
