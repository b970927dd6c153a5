package controller

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/pipeline"
)

// A tenant's UDP Service that declares kube-dns's cluster IP as an externalIP (refused)
// and lists the DNS pod as its own endpoint: when the tenant drops that endpoint, the
// stale flows are those of the frontends the tenant's port really holds, and kube-dns's
// clients keep their conntrack entries.
func TestTenantEndpointFlipKeepsOtherServicesFlows(t *testing.T) {
	dp, ct := &fakeDataplane{}, &fakeConntrack{}
	udp := func(ns, name, clusterIP string, created time.Time) *v1.Service {
		s := service(name, clusterIP)
		s.Namespace, s.CreationTimestamp = ns, metav1.NewTime(created)
		s.Spec.Ports[0] = v1.ServicePort{Name: "dns", Port: 53, Protocol: v1.ProtocolUDP}
		return s
	}
	udpSlice := func(ns, svc, name string, addrs ...string) *discovery.EndpointSlice {
		s := slice(svc, name, addrs...)
		s.Namespace = ns
		port, pname, proto := int32(53), "dns", v1.ProtocolUDP
		s.Ports[0].Port, s.Ports[0].Name, s.Ports[0].Protocol = &port, &pname, &proto
		return s
	}
	t0 := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	dns := udp("kube-system", "kube-dns", "10.96.0.10", t0)
	evil := udp("tenant", "evil", "10.96.0.99", t0.Add(time.Hour))
	evil.Spec.ExternalIPs = []string{"10.96.0.10"}
	evilSlice := udpSlice("tenant", "evil", "evil-1", "10.244.1.53", "10.244.9.9")
	client := fake.NewClientset(dns, udpSlice("kube-system", "kube-dns", "kube-dns-1", "10.244.1.53"), evil, evilSlice)
	p := New(client, dp, Config{NodeName: "node-1", MinSyncPeriod: 10 * time.Millisecond, SyncPeriod: time.Hour, Conntrack: ct, Pipeline: pipeline.Config{Compile: compile.Config{MasqueradeBit: 14}}}, logr.Discard())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = p.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	waitFor(t, "first sync", func() bool { return strings.Contains(dp.last(), "10.244.9.9 . 53") })
	ct.reset()

	evilSlice.Endpoints = evilSlice.Endpoints[1:] // the tenant drops the DNS pod
	if _, err := client.DiscoveryV1().EndpointSlices("tenant").Update(ctx, evilSlice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the tenant's own stale flows deleted", func() bool {
		return ct.selects(model.ProtoUDP, "10.96.0.99", 53, "10.244.1.53", 53)
	})
	if ct.selects(model.ProtoUDP, "10.96.0.10", 53, "10.244.1.53", 53) {
		t.Error("kube-dns's conntrack entries (10.96.0.10:53 → 10.244.1.53:53) would be deleted by the tenant's endpoint change")
	}
}
