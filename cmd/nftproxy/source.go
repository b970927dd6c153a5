package main

import (
	"context"
	"fmt"
	"net/netip"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/controller"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/pipeline"
	"github.com/nftproxy/nftproxy/nft"
)

// apiState is one listing of what the running proxy watches, narrowed as its informers
// are (controller.ServiceListOptions, SliceListOptions). --dry-run, explain and verify
// all start from it, so each compiles exactly what the proxy would.
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
	var s apiState
	var svcOpts, sliceOpts metav1.ListOptions
	controller.ServiceListOptions(&svcOpts)
	controller.SliceListOptions(&sliceOpts)
	svcs, err := client.CoreV1().Services("").List(ctx, svcOpts)
	if err != nil {
		return s, fmt.Errorf("listing services: %w", err)
	}
	slices, err := client.DiscoveryV1().EndpointSlices("").List(ctx, sliceOpts)
	if err != nil {
		return s, fmt.Errorf("listing endpoint slices: %w", err)
	}
	s.services, s.slices = ptrs(svcs.Items), ptrs(slices.Items)
	node, err := client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	switch {
	case err == nil:
		s.node = node
	case !apierrors.IsNotFound(err):
		return s, fmt.Errorf("reading node %q: %w", nodeName, err)
	}
	cidrs, err := client.NetworkingV1().ServiceCIDRs().List(ctx, metav1.ListOptions{})
	switch {
	case err == nil:
		s.servesCIDRs = true
		for _, c := range cidrs.Items {
			s.serviceCIDRs = append(s.serviceCIDRs, parseCIDRs(c.DeletionTimestamp, c.Spec.CIDRs)...)
		}
	case !apierrors.IsNotFound(err):
		return s, fmt.Errorf("listing service CIDRs: %w", err)
	}
	return s, nil
}

// compile compiles the listing with cfg as the proxy does: the ServiceCIDR objects'
// ranges when the API serves them, else cfg's (the flag's).
func (s apiState) compile(cfg controller.Config) (*model.Snapshot, []*nft.Ruleset, []model.Problem, error) {
	if s.servesCIDRs {
		cfg.ServiceCIDRs = s.serviceCIDRs
	}
	return pipeline.Compile(cfg.Pipeline(), map[nft.Family]*compile.Slots{}, s.services, s.slices, s.node)
}

func parseCIDRs(deleted *metav1.Time, cidrs []string) []netip.Prefix {
	var out []netip.Prefix
	for _, c := range cidrs {
		if p, err := netip.ParsePrefix(c); err == nil && deleted == nil {
			out = append(out, p.Masked())
		}
	}
	return out
}

func ptrs[T any](items []T) []*T {
	out := make([]*T, len(items))
	for i := range items {
		out[i] = &items[i]
	}
	return out
}
