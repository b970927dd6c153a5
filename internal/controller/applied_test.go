package controller

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/metrics"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/nft"
)

// Config.Applied is told the rulesets of each accepted sync, and only of accepted ones:
// the per-service counters name service ports through their parts' tags.
func TestAppliedRulesetsArePublished(t *testing.T) {
	dp := &fakeDataplane{fail: 1} // the first attempt fails: nothing is published for it
	var parts metrics.AppliedParts
	published := make(chan int, 10)
	client := fake.NewClientset(service("web", "10.96.0.1"), slice("web", "web-1", "10.244.1.2"))
	p := New(client, dp, Config{NodeName: "node-1", MasqueradeBit: 14, MinSyncPeriod: 10 * time.Millisecond, SyncPeriod: time.Hour,
		Applied: func(rs []*nft.Ruleset) {
			dp.mu.Lock()
			calls := dp.calls
			dp.mu.Unlock()
			parts.Publish(rs)
			published <- calls
		}}, logr.Discard())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = p.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	select {
	case calls := <-published:
		if calls < 2 {
			t.Errorf("published after %d Apply calls; the first one failed", calls)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no rulesets published")
	}
	web := model.ServicePortName{Namespace: "default", Name: "web", Port: "http", Protocol: model.ProtoTCP}
	if got, ok := parts.ServicePort(nft.IPv4, compile.ChainName("port", web)); !ok || got != web {
		t.Errorf("the published part: %v, %v; want %v", got, ok, web)
	}
}
