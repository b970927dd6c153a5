package main

import (
	"context"
	"github.com/nftproxy/nftproxy/internal/compile"
	"net/netip"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/nftproxy/nftproxy/internal/controller"
	"github.com/nftproxy/nftproxy/internal/pipeline"
	"github.com/nftproxy/nftproxy/nft"
)

// One listing serves --dry-run, explain and verify: it is narrowed as the proxy's
// informers are (a Service labelled with another proxy's name is left out), and the
// ServiceCIDR objects' ranges replace --service-cluster-ip-range when the API serves
// them (the dry run once left the ServiceCIDR drop rule out).
func TestListAPICompilesWhatTheProxyWould(t *testing.T) {
	other := service("other-proxy", "ClusterIP", []string{"10.96.7.7"}, 80, 0)
	other.Labels = map[string]string{"service.kubernetes.io/service-proxy-name": "someone-else"}
	client := fake.NewClientset(append(cluster(), other, slice("other-proxy", "other-proxy", "IPv4", "node-2", "10.244.1.20"))...)
	state, err := listAPI(context.Background(), client, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	if state.node == nil || !state.servesCIDRs {
		t.Fatalf("node %v, serves ServiceCIDRs %v: want both", state.node, state.servesCIDRs)
	}
	for _, s := range state.services {
		if s.Name == other.Name {
			t.Errorf("the listing holds %s, labelled with another proxy's name", s.Name)
		}
	}
	cfg := controller.Config{
		NodeName: "node-1",
		Pipeline: pipeline.Config{
			Compile: compile.Config{
				DetectLocal: compile.DetectLocal{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}},
			},
			ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.100.0.0/16")},
		},
	}
	_, rulesets, _, err := state.compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	for _, rs := range rulesets {
		text.WriteString(nft.Render(rs))
	}
	out := text.String()
	if !strings.Contains(out, "10.96.0.0/16") || strings.Contains(out, "10.100.0.0/16") {
		t.Errorf("want the ServiceCIDR object's 10.96.0.0/16 and not the flag's 10.100.0.0/16 in:\n%s", out)
	}
	if strings.Contains(out, "10.96.7.7") {
		t.Errorf("the other proxy's Service 10.96.7.7 was compiled")
	}
	if !strings.Contains(out, "10.96.0.10") {
		t.Errorf("default/echo's 10.96.0.10 missing")
	}

	// A Node that does not exist is not an error (no node ports on primary IPs), and an
	// API without ServiceCIDRs leaves the flag's ranges in force.
	state, err = listAPI(context.Background(), fake.NewClientset(), "node-9")
	if err != nil || state.node != nil {
		t.Fatalf("missing node: %v, %v", state.node, err)
	}
}
