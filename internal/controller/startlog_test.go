package controller

import (
	"context"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/pipeline"
)

// At -v=0 the startup is visible: what the informers listed, when the first sync starts,
// and when it is done (counts, time); later syncs only at -v=2. A first sync that fails
// and is retried says "started" once.
func TestStartupProgressAtV0(t *testing.T) {
	var logs logLines
	dp := &fakeDataplane{fail: 1}
	client := fake.NewClientset()
	ctx, cancel := context.WithCancel(context.Background())
	for _, svc := range []*v1.Service{service("a", "10.96.0.1"), service("b", "10.96.0.2")} {
		if _, err := client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, slice("a", "a-1", "10.244.1.2", "10.244.1.3"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := New(client, dp, Config{NodeName: "node-1", MinSyncPeriod: 10 * time.Millisecond, SyncPeriod: time.Hour, Pipeline: pipeline.Config{Compile: compile.Config{MasqueradeBit: 14}}}, logs.logger())
	done := make(chan struct{})
	go func() { _ = p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	waitFor(t, "the first sync", func() bool { return logs.count("First sync done") == 1 })
	if _, err := client.CoreV1().Services("default").Create(ctx, service("c", "10.96.0.3"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "service c programmed", func() bool { return strings.Contains(dp.last(), "default/c:http") })

	out := logs.String()
	for _, want := range []string{
		`"msg"="Informer caches synced; starting sync loop" "services"=2 "endpointSlices"=1 "endpoints"=2 `,
		`"msg"="First sync started"`,
		`"msg"="Sync failed; the previous ruleset stays in the kernel, will retry"`,
		`"msg"="First sync done" "services"=2 `,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("-v=0 log lacks %s:\n%s", want, out)
		}
	}
	i, j, k := strings.Index(out, "Informer caches synced"), strings.Index(out, "First sync started"), strings.Index(out, "First sync done")
	if !(i < j && j < k) {
		t.Errorf("out of order:\n%s", out)
	}
	if n := logs.count("First sync started"); n != 1 {
		t.Errorf("%d lines say the first sync started, want 1:\n%s", n, out)
	}
	if !strings.Contains(out, `"took"=`) || strings.Contains(out, `"msg"="Synced"`) {
		t.Errorf("want took on the -v=0 lines and no V(2) Synced line:\n%s", out)
	}
}
