package controller

import (
	"testing"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/metrics"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/nft"
)

// What a sync applied is the dataplane's: the per-service counters (metrics.PartsOf
// over the Applier's Applied, as main wires them) name a service port through the
// part the controller gave the dataplane, and only once a transaction was accepted.
func TestAppliedPartsFromTheDataplane(t *testing.T) {
	dp := &fakeDataplane{fail: 1} // the first attempt fails: nothing is applied by it
	parts := metrics.PartsOf(dp.Applied)
	web := model.ServicePortName{Namespace: "default", Name: "web", Port: "http", Protocol: model.ProtoTCP}
	if _, ok := parts.ServicePort(nft.IPv4, compile.ChainName("port", web)); ok {
		t.Fatal("a part found before any sync")
	}
	startProxy(t, dp, service("web", "10.96.0.1"), slice("web", "web-1", "10.244.1.2"))
	waitFor(t, "an accepted sync", func() bool { dp.mu.Lock(); defer dp.mu.Unlock(); return len(dp.applied) > 0 })
	dp.mu.Lock()
	calls := dp.calls
	dp.mu.Unlock()
	if calls < 2 {
		t.Errorf("a sync accepted after %d Apply calls; the first one failed", calls)
	}
	if got, ok := parts.ServicePort(nft.IPv4, compile.ChainName("port", web)); !ok || got != web {
		t.Errorf("the applied part: %v, %v; want %v", got, ok, web)
	}
}
