package model

import (
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

// Cache builds snapshots like Build, but remembers each service's result and reuses it
// while the Service and its EndpointSlices are the same objects (informer caches replace
// an object on every change and never modify one in place). A sync then costs a pass of
// pointer comparisons over all services plus the work for the ones that changed. A
// Cache must be used by one goroutine at a time.
type Cache struct {
	services map[nsName]*cachedService
	order    []nsName // sorted keys of services, valid while the set of services is unchanged
}

type cachedService struct {
	svc      *v1.Service
	slices   []*discovery.EndpointSlice
	ports    []ServicePort
	problems []Problem
}

// NewCache returns an empty Cache.
func NewCache() *Cache { return &Cache{services: map[nsName]*cachedService{}} }

// Build returns what Build returns for the same arguments (the problems possibly in
// another order).
func (c *Cache) Build(services []*v1.Service, epSlices []*discovery.EndpointSlice, node *v1.Node) (*Snapshot, []Problem) {
	nb := &builder{}
	snap := &Snapshot{Node: nb.node(node)}
	problems := nb.problems
	bySvc := groupSlicesUnsorted(epSlices)
	next := make(map[nsName]*cachedService, len(services))
	sameSet := len(services) == len(c.services)
	n := 0
	for _, svc := range services {
		k := nsName{svc.Namespace, svc.Name}
		group := bySvc[k]
		cs := c.services[k]
		if cs == nil {
			sameSet = false
		}
		if cs == nil || cs.svc != svc || !slicesEqual(cs.slices, group) {
			b := &builder{}
			ports := b.service(svc, sortedByName(group))
			slices.SortFunc(ports, func(x, y ServicePort) int { return x.Name.Compare(y.Name) })
			cs = &cachedService{svc: svc, slices: group, ports: ports, problems: b.problems}
		}
		next[k] = cs
		n += len(cs.ports)
	}
	c.services = next
	if !sameSet || len(c.order) != len(next) {
		c.order = c.order[:0]
		for k := range next {
			c.order = append(c.order, k)
		}
		slices.SortFunc(c.order, func(a, b nsName) int {
			if r := strings.Compare(a.ns, b.ns); r != 0 {
				return r
			}
			return strings.Compare(a.name, b.name)
		})
	}
	if n > 0 {
		snap.Services = make([]ServicePort, 0, n)
	}
	for _, k := range c.order {
		cs := next[k]
		snap.Services = append(snap.Services, cs.ports...)
		problems = append(problems, cs.problems...)
	}
	return snap, problems
}

// groupSlicesUnsorted indexes the slices that may carry endpoints by service, in the
// order given; slicesEqual compares such groups, sortedByName orders one for building.
func groupSlicesUnsorted(ss []*discovery.EndpointSlice) map[nsName][]*discovery.EndpointSlice {
	out := map[nsName][]*discovery.EndpointSlice{}
	for _, s := range ss {
		svc := s.Labels[discovery.LabelServiceName]
		if svc == "" || (s.AddressType != discovery.AddressTypeIPv4 && s.AddressType != discovery.AddressTypeIPv6) {
			continue
		}
		k := nsName{s.Namespace, svc}
		out[k] = append(out[k], s)
	}
	return out
}

// slicesEqual reports whether a and b hold the same slice objects, in any order.
func slicesEqual(a, b []*discovery.EndpointSlice) bool {
	if len(a) != len(b) {
		return false
	}
	for _, s := range a {
		if !slices.Contains(b, s) {
			return false
		}
	}
	return true
}

func sortedByName(ss []*discovery.EndpointSlice) []*discovery.EndpointSlice {
	if len(ss) < 2 {
		return ss
	}
	out := slices.Clone(ss)
	slices.SortFunc(out, func(a, b *discovery.EndpointSlice) int { return strings.Compare(a.Name, b.Name) })
	return out
}
