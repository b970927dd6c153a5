package source

import (
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
)

// LabelServiceProxyName on a Service hands it to another service proxy: nftproxy, like
// kube-proxy, does not proxy a Service that carries it (whatever its value).
const LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"

// The selectors kube-proxy v1.37 puts on its informers (cmd/kube-proxy/app/server.go),
// so that the API server does not even send these objects:
//
//   - Services: no service-proxy-name label, and spec.clusterIP is not "None" (headless
//     Services are answered by DNS, not proxied);
//   - EndpointSlices: no service.kubernetes.io/headless label (the EndpointSlice
//     controller sets it on the slices of headless Services).
//
// Nodes and ServiceCIDRs are not filtered.
var (
	serviceLabelSelector = labels.NewSelector().Add(mustRequirement(LabelServiceProxyName))
	serviceFieldSelector = fields.OneTermNotEqualSelector("spec.clusterIP", v1.ClusterIPNone)
	sliceLabelSelector   = labels.NewSelector().Add(mustRequirement(v1.IsHeadlessService))
)

func mustRequirement(key string) labels.Requirement {
	r, err := labels.NewRequirement(key, selection.DoesNotExist, nil)
	if err != nil {
		panic(err) // a constant, valid key
	}
	return *r
}

// ServiceListOptions narrows a Service list or watch to the Services nftproxy proxies.
// The informers use it; so should anything that lists Services to compare with what
// nftproxy programs (dry run, verify, explain).
func ServiceListOptions(o *metav1.ListOptions) {
	o.LabelSelector = serviceLabelSelector.String()
	o.FieldSelector = serviceFieldSelector.String()
}

// SliceListOptions narrows an EndpointSlice list or watch to the slices of proxied
// Services (not headless ones).
func SliceListOptions(o *metav1.ListOptions) {
	o.LabelSelector = sliceLabelSelector.String()
}
