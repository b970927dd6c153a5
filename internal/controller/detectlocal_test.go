package controller

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/pipeline"
)

// --detect-local-mode=NodeCIDR: the first sync waits for the Node's
// pod CIDRs, as kube-proxy; the local check is the Node's pod CIDR, and a change of it
// reprograms (kube-proxy exits to do the same). Node() is the controller's Node, which
// the health server reads (one Node informer for both).
func TestNodeCIDRWaitsAndFollowsPodCIDRs(t *testing.T) {
	dp := &fakeDataplane{}
	client := fake.NewClientset()
	ctx, cancel := context.WithCancel(context.Background())
	if _, err := client.CoreV1().Services("default").Create(ctx, service("a", "10.96.0.1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, slice("a", "a-1", "10.244.2.2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := New(client, dp, Config{
		NodeName:      "node-1",
		MinSyncPeriod: 10 * time.Millisecond,
		SyncPeriod:    time.Hour,
		Pipeline: pipeline.Config{
			Compile: compile.Config{
				MasqueradeBit: 14,
				DetectLocal:   compile.DetectLocal{Mode: compile.LocalNodeCIDR},
			},
		},
	}, logr.Discard())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	// no Node yet: no sync (the check would be missing)
	time.Sleep(300 * time.Millisecond)
	if dp.last() != "" || p.Node() != nil {
		t.Fatalf("synced before the Node had pod CIDRs: node %v\n%s", p.Node(), dp.last())
	}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}
	if node, _ = client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); node == nil {
		t.Fatal("creating the node")
	}
	waitFor(t, "the Node in Node()", func() bool { return p.Node() != nil })
	time.Sleep(300 * time.Millisecond)
	if dp.last() != "" {
		t.Fatalf("synced before the Node had pod CIDRs:\n%s", dp.last())
	}
	node.Spec.PodCIDRs = []string{"10.244.1.0/24"}
	if _, err := client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// a source in the pod CIDR is kept, one outside it masqueraded
	waitFor(t, "first sync with the pod CIDR", func() bool {
		return fate(dp.lastRuleset(), "10.244.1.5", "10.96.0.1:80") == "10.244.2.2:8080 100%" &&
			fate(dp.lastRuleset(), "10.244.9.5", "10.96.0.1:80") == "10.244.2.2:8080+masquerade 100%"
	})
	node.Spec.PodCIDRs = []string{"10.244.9.0/24"}
	if _, err := client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the new pod CIDR programmed", func() bool {
		return fate(dp.lastRuleset(), "10.244.9.5", "10.96.0.1:80") == "10.244.2.2:8080 100%" &&
			fate(dp.lastRuleset(), "10.244.1.5", "10.96.0.1:80") == "10.244.2.2:8080+masquerade 100%" &&
			strings.Contains(dp.last(), "ip saddr != 10.244.9.0/24") && !strings.Contains(dp.last(), "10.244.1.0/24")
	})
	if err := client.CoreV1().Nodes().Delete(ctx, "node-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "Node() nil after the Node is deleted", func() bool { return p.Node() == nil })
}

// Without pod CIDRs within PodCIDRTimeout the proxy fails, as kube-proxy.
func TestNodeCIDRTimeout(t *testing.T) {
	old := PodCIDRTimeout
	PodCIDRTimeout = 200 * time.Millisecond
	defer func() { PodCIDRTimeout = old }()
	client := fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}})
	p := New(client, &fakeDataplane{}, Config{
		NodeName:      "node-1",
		MinSyncPeriod: time.Millisecond,
		SyncPeriod:    time.Hour,
		Pipeline: pipeline.Config{
			Compile: compile.Config{
				DetectLocal: compile.DetectLocal{Mode: compile.LocalNodeCIDR},
			},
		},
	}, logr.Discard())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var err error
	select { // Run returns by itself (its informers stopped), ctx still live
	case err = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after PodCIDRTimeout")
	}
	if err == nil || !strings.Contains(err.Error(), `timeout waiting for PodCIDR allocation on node "node-1"`) {
		t.Fatalf("Run: %v", err)
	}
}
