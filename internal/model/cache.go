package model

import (
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
)

// Cache builds snapshots like Build, but remembers each service's result and reuses it
// while the Service and its EndpointSlices are the same objects (informer caches replace
// an object on every change and never modify one in place). Objects are recognised by
// identity, so a sync costs a pass of pointer lookups over all objects plus the work for
// the services that changed. A Cache must be used by one goroutine at a time.
type Cache struct {
	gen      uint64
	services map[nsName]*cachedService
	// byObject finds a service by its Service object: hashing a pointer costs less than
	// hashing a name, and nearly every Service of a sync is the one of the sync before
	byObject map[*v1.Service]*cachedService
	slices   map[*discovery.EndpointSlice]*cachedSlice
	order    []*cachedService // services with a Service object, in name order
}

type cachedService struct {
	key      nsName
	svc      *v1.Service                // nil: only slices refer to this name
	slices   []*discovery.EndpointSlice // the service's proxied slices, in no order
	ports    []ServicePort
	problems []Problem
	dirty    bool   // ports must be built again
	gen      uint64 // last Build that listed the Service
}

type cachedSlice struct {
	key     nsName
	proxied bool // labelled with a service and of an IP address type
	gen     uint64
}

// NewCache returns an empty Cache.
func NewCache() *Cache {
	return &Cache{services: map[nsName]*cachedService{}, byObject: map[*v1.Service]*cachedService{},
		slices: map[*discovery.EndpointSlice]*cachedSlice{}}
}

// Build returns what Build returns for the same arguments (the problems possibly in
// another order).
func (c *Cache) Build(services []*v1.Service, epSlices []*discovery.EndpointSlice, node *v1.Node) (*Snapshot, []Problem) {
	return c.BuildFrom(Inputs{Services: services, Slices: epSlices, Node: node})
}

// BuildFrom returns what BuildFrom returns for the same inputs (the problems possibly in
// another order).
func (c *Cache) BuildFrom(in Inputs) (*Snapshot, []Problem) {
	c.gen++
	services, epSlices := in.Services, in.Slices
	nb := &builder{}
	snap := newSnapshot(nb, in)
	problems := nb.problems

	// Slices: new ones join their service, vanished ones leave it.
	for _, s := range epSlices {
		if e := c.slices[s]; e != nil {
			e.gen = c.gen
			continue
		}
		e := &cachedSlice{gen: c.gen}
		if svc := s.Labels[discovery.LabelServiceName]; svc != "" && (s.AddressType == discovery.AddressTypeIPv4 || s.AddressType == discovery.AddressTypeIPv6) {
			e.key, e.proxied = nsName{s.Namespace, svc}, true
			cs := c.entry(e.key)
			cs.slices = append(cs.slices, s)
			cs.dirty = true
		}
		c.slices[s] = e
	}
	if len(c.slices) > len(epSlices) {
		for s, e := range c.slices {
			if e.gen == c.gen {
				continue
			}
			delete(c.slices, s)
			if cs := c.services[e.key]; e.proxied && cs != nil {
				if i := slices.Index(cs.slices, s); i >= 0 {
					cs.slices = slices.Delete(cs.slices, i, i+1)
				}
				cs.dirty = true
				c.forgetIfUnused(cs)
			}
		}
	}

	// Services: a replaced object or a changed slice set builds the ports again.
	var rebuilt []nsName // handed on as snap.Changes
	var added []*cachedService
	seen := 0
	for _, svc := range services {
		cs := c.byObject[svc]
		if cs == nil {
			cs = c.entry(nsName{svc.Namespace, svc.Name})
			if cs.svc == nil {
				added = append(added, cs)
			} else {
				delete(c.byObject, cs.svc)
			}
			cs.svc, cs.dirty = svc, true
			c.byObject[svc] = cs
		}
		if cs.gen != c.gen {
			seen++
		}
		cs.gen = c.gen
		if cs.dirty {
			b := &builder{}
			ports := b.service(svc, sortedByName(cs.slices))
			slices.SortFunc(ports, func(x, y ServicePort) int { return x.Name.Compare(y.Name) })
			cs.ports, cs.problems, cs.dirty = ports, b.problems, false
			rebuilt = append(rebuilt, cs.key)
		}
	}
	// The order changes in place: the Services that are gone leave it, a few new ones
	// are inserted where their names go (a sort of all 30,000 cost milliseconds for the
	// one Service a rollout adds; inserting 30,000 one by one would cost far more).
	if gone := len(c.order) + len(added) - seen; gone > 0 {
		c.order = slices.DeleteFunc(c.order, func(cs *cachedService) bool {
			if cs.gen == c.gen {
				return false
			}
			delete(c.byObject, cs.svc)
			cs.svc, cs.ports, cs.problems, cs.dirty = nil, nil, nil, true
			c.forgetIfUnused(cs)
			return true
		})
	}
	byName := func(a, b *cachedService) int { return compareNames(a.key, b.key) }
	if len(added) <= 16 {
		for _, cs := range added {
			i, _ := slices.BinarySearchFunc(c.order, cs, byName)
			c.order = slices.Insert(c.order, i, cs)
		}
	} else { // many (the first build): one sort instead of an insertion each
		c.order = append(c.order, added...)
		slices.SortFunc(c.order, byName)
	}
	n := 0
	for _, cs := range c.order {
		n += len(cs.ports)
	}
	if n > 0 {
		snap.Services = make([]*ServicePort, 0, n)
	}
	for _, cs := range c.order {
		snap.Services = appendPointers(snap.Services, cs.ports)
		problems = append(problems, cs.problems...)
	}
	slices.SortFunc(rebuilt, compareNames)
	snap.Changes = Changes{cache: c, gen: c.gen, rebuilt: rebuilt}
	return snap, problems
}

// entry returns the cached service of k, creating an empty one.
func (c *Cache) entry(k nsName) *cachedService {
	cs := c.services[k]
	if cs == nil {
		cs = &cachedService{key: k, dirty: true}
		c.services[k] = cs
	}
	return cs
}

// forgetIfUnused drops a service entry that neither a Service nor a slice refers to.
func (c *Cache) forgetIfUnused(cs *cachedService) {
	if cs.svc == nil && len(cs.slices) == 0 {
		delete(c.services, cs.key)
	}
}

func sortedByName(ss []*discovery.EndpointSlice) []*discovery.EndpointSlice {
	if len(ss) < 2 {
		return ss
	}
	out := slices.Clone(ss)
	slices.SortFunc(out, func(a, b *discovery.EndpointSlice) int { return strings.Compare(a.Name, b.Name) })
	return out
}
