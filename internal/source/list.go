package source

import (
	"context"
	"fmt"
	"net/netip"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Listing is one listing of what the running proxy watches, narrowed as its informers
// are (ServiceListOptions, SliceListOptions).
type Listing struct {
	Services []*v1.Service
	Slices   []*discovery.EndpointSlice
	Node     *v1.Node // nil: there is no Node of that name (no node ports on primary IPs)
	// ServiceCIDRs are the ServiceCIDR objects' ranges; ServesCIDRs is false when the
	// API has no ServiceCIDR resource, and the proxy then uses --service-cluster-ip-range.
	ServiceCIDRs []netip.Prefix
	ServesCIDRs  bool
}

// List lists Services, EndpointSlices, ServiceCIDRs and the node's Node once, as the
// proxy's informers see them: --dry-run, explain and verify start from it, so each
// compiles exactly what the proxy would.
func List(ctx context.Context, client kubernetes.Interface, nodeName string) (Listing, error) {
	var l Listing
	var svcOpts, sliceOpts metav1.ListOptions
	ServiceListOptions(&svcOpts)
	SliceListOptions(&sliceOpts)
	svcs, err := client.CoreV1().Services("").List(ctx, svcOpts)
	if err != nil {
		return l, fmt.Errorf("listing services: %w", err)
	}
	slices, err := client.DiscoveryV1().EndpointSlices("").List(ctx, sliceOpts)
	if err != nil {
		return l, fmt.Errorf("listing endpoint slices: %w", err)
	}
	l.Services, l.Slices = ptrs(svcs.Items), ptrs(slices.Items)
	node, err := client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	switch {
	case err == nil:
		l.Node = node
	case !apierrors.IsNotFound(err):
		return l, fmt.Errorf("reading node %q: %w", nodeName, err)
	}
	cidrs, err := client.NetworkingV1().ServiceCIDRs().List(ctx, metav1.ListOptions{})
	switch {
	case err == nil:
		l.ServesCIDRs = true
		l.ServiceCIDRs = ServiceCIDRsOf(ptrs(cidrs.Items))
	case !apierrors.IsNotFound(err):
		return l, fmt.Errorf("listing service CIDRs: %w", err)
	}
	return l, nil
}

func ptrs[T any](items []T) []*T {
	out := make([]*T, len(items))
	for i := range items {
		out[i] = &items[i]
	}
	return out
}
