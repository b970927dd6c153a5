package main

import (
	"context"
	"net/netip"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/controller"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/pipeline"
	"github.com/nftproxy/nftproxy/internal/source"
	"github.com/nftproxy/nftproxy/nft"
)

// apiState is one listing of what the running proxy watches (source.List), narrowed as
// its informers are. --dry-run, explain and verify all start from it, so each compiles
// exactly what the proxy would.
type apiState struct {
	services []*v1.Service
	slices   []*discovery.EndpointSlice
	node     *v1.Node // nil: there is no Node of that name (no node ports on primary IPs)
	// serviceCIDRs are the ServiceCIDR objects' ranges; servesCIDRs is false when the
	// API has no ServiceCIDR resource, and the proxy then uses --service-cluster-ip-range.
	serviceCIDRs []netip.Prefix
	servesCIDRs  bool
}

// listAPI lists Services, EndpointSlices, ServiceCIDRs and the node's Node once.
func listAPI(ctx context.Context, client kubernetes.Interface, nodeName string) (apiState, error) {
	l, err := source.List(ctx, client, nodeName)
	return apiState{services: l.Services, slices: l.Slices, node: l.Node, serviceCIDRs: l.ServiceCIDRs, servesCIDRs: l.ServesCIDRs}, err
}

// compile compiles the listing with cfg as the proxy does: the ServiceCIDR objects'
// ranges when the API serves them, else cfg's (the flag's).
func (s apiState) compile(cfg controller.Config) (*model.Snapshot, []*nft.Ruleset, []model.Problem, error) {
	pc := cfg.Pipeline
	if s.servesCIDRs {
		pc.ServiceCIDRs = s.serviceCIDRs
	}
	return pipeline.Compile(pc, map[nft.Family]*compile.Slots{}, s.services, s.slices, s.node)
}

func ptrs[T any](items []T) []*T {
	out := make([]*T, len(items))
	for i := range items {
		out[i] = &items[i]
	}
	return out
}
