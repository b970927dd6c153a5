package model

import (
	"slices"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nftproxy/nftproxy/internal/par"
)

// Cache builds snapshots like Build, but remembers each service's result and reuses it
// while the Service and its EndpointSlices are the same objects (informer caches replace
// an object on every change and never modify one in place). It is told what changed in
// one of two ways: BuildChanges takes the objects that changed since its last build, by
// namespace and name, and costs what they cost; BuildFrom takes the full lists and finds
// the changes itself, with a lookup per object. Either way the state is the same: the
// objects by namespace and name, so the lists given to BuildFrom must not hold two
// objects of one kind with the same namespace and name (an informer's never do). A Cache
// must be used by one goroutine at a time.
type Cache struct {
	gen      uint64
	services map[nsName]*cachedService // by the service's name, with or without a Service
	slices   map[nsName]*cachedSlice   // by the slice's own name
	// changed names the services whose Service or proxied slices changed since the last
	// build: their ports are built again, or dropped
	changed map[nsName]struct{}
	// flat is the last snapshot's Services (never modified: the snapshot holds it); the
	// next one is a copy with the changed services' ports replaced
	flat []*ServicePort
	// withProblems are the services whose last build reported problems, and problems
	// their problems in name order, assembled again only when a changed service had or
	// has some: most syncs change no service with problems
	withProblems map[nsName]*cachedService
	problems     []Problem
}

type cachedService struct {
	key      nsName
	svc      *v1.Service                // nil: only slices refer to this name
	slices   []*discovery.EndpointSlice // the service's proxied slices, in no order
	ports    []ServicePort
	problems []Problem
	listed   uint64 // the build whose full lists (BuildFrom) had the Service last
}

type cachedSlice struct {
	obj     *discovery.EndpointSlice
	svc     nsName // the service it belongs to, when proxied
	proxied bool   // labelled with a service and of an IP address type
	listed  uint64 // the build whose full lists had the slice last
}

// Delta is what changed among the Services and EndpointSlices since a Cache's last
// build: each object by its namespace and name as it is now, nil when it is gone. An
// entry for an object that did not change costs a lookup and changes nothing.
type Delta struct {
	Services map[types.NamespacedName]*v1.Service
	Slices   map[types.NamespacedName]*discovery.EndpointSlice
}

// NewCache returns an empty Cache.
func NewCache() *Cache {
	return &Cache{services: map[nsName]*cachedService{}, slices: map[nsName]*cachedSlice{},
		changed: map[nsName]struct{}{}, withProblems: map[nsName]*cachedService{}}
}

// Build returns what Build returns for the same arguments (the problems possibly in
// another order).
func (c *Cache) Build(services []*v1.Service, epSlices []*discovery.EndpointSlice, node *v1.Node) (*Snapshot, []Problem) {
	return c.BuildFrom(Inputs{Services: services, Slices: epSlices, Node: node})
}

// BuildFrom returns what BuildFrom returns for the same inputs (the problems possibly in
// another order). It finds what changed since the last build by looking up every object,
// then builds as BuildChanges does.
func (c *Cache) BuildFrom(in Inputs) (*Snapshot, []Problem) {
	listing := c.gen + 1 // the build this is
	if len(c.services) == 0 && len(c.slices) == 0 {
		// the first build (a cold start): maps of the right size at once, instead of
		// growing them step by step through 30,000 insertions
		c.services = make(map[nsName]*cachedService, len(in.Services))
		c.slices = make(map[nsName]*cachedSlice, len(in.Slices))
		c.changed = make(map[nsName]struct{}, len(in.Services))
	}
	for _, s := range in.Slices {
		k := nsName{s.Namespace, s.Name}
		e := c.slices[k]
		if e == nil || e.obj != s {
			e = c.setSlice(k, e, s)
		}
		e.listed = listing
	}
	if len(c.slices) > len(in.Slices) {
		for k, e := range c.slices {
			if e.listed != listing {
				c.setSlice(k, e, nil) // deleting while ranging is allowed
			}
		}
	}
	listed := 0
	for _, svc := range in.Services {
		k := nsName{svc.Namespace, svc.Name}
		cs := c.services[k]
		if cs == nil || cs.svc != svc {
			cs = c.setService(k, cs, svc)
		}
		cs.listed = listing
		listed++
	}
	if len(c.services) > listed {
		for k, cs := range c.services {
			if cs.svc != nil && cs.listed != listing {
				c.setService(k, cs, nil)
			}
		}
	}
	return c.build(in)
}

// BuildChanges returns the snapshot of the cache's objects with d applied: what BuildFrom
// returns for the full lists they make up, at the cost of what changed. The rest of the
// inputs come from in; its Services and Slices are not read.
func (c *Cache) BuildChanges(d Delta, in Inputs) (*Snapshot, []Problem) {
	// The final state does not depend on the order in which the changes are applied: a
	// service's slices are kept in no order and sorted when its ports are built.
	for k, s := range d.Slices {
		k := nsName{k.Namespace, k.Name}
		c.setSlice(k, c.slices[k], s)
	}
	for k, svc := range d.Services {
		k := nsName{k.Namespace, k.Name}
		c.setService(k, c.services[k], svc)
	}
	return c.build(in)
}

// setSlice makes s (nil: none) the slice named k, whose entry is e (nil: none): it
// leaves the service it belonged to and joins the one it names, if it is proxied. It
// returns k's entry.
func (c *Cache) setSlice(k nsName, e *cachedSlice, s *discovery.EndpointSlice) *cachedSlice {
	if (e == nil && s == nil) || (e != nil && e.obj == s) {
		return e
	}
	if e != nil && e.proxied {
		if cs := c.services[e.svc]; cs != nil {
			if i := slices.Index(cs.slices, e.obj); i >= 0 {
				cs.slices = slices.Delete(cs.slices, i, i+1)
			}
			c.changed[cs.key] = struct{}{}
			c.forgetIfUnused(cs)
		}
	}
	if s == nil {
		delete(c.slices, k)
		return nil
	}
	if e == nil {
		e = &cachedSlice{}
		c.slices[k] = e
	}
	e.obj, e.svc, e.proxied = s, nsName{}, false
	if svc := s.Labels[discovery.LabelServiceName]; svc != "" && (s.AddressType == discovery.AddressTypeIPv4 || s.AddressType == discovery.AddressTypeIPv6) {
		e.svc, e.proxied = nsName{s.Namespace, svc}, true
		cs := c.entry(e.svc)
		cs.slices = append(cs.slices, s)
		c.changed[cs.key] = struct{}{}
	}
	return e
}

// setService makes svc (nil: none) the Service named k, whose entry is cs (nil: none).
// It returns k's entry.
func (c *Cache) setService(k nsName, cs *cachedService, svc *v1.Service) *cachedService {
	if cs == nil {
		if svc == nil {
			return nil
		}
		cs = &cachedService{key: k}
		c.services[k] = cs
	}
	if cs.svc == svc {
		return cs
	}
	cs.svc = svc
	c.changed[k] = struct{}{}
	if svc == nil {
		cs.ports, cs.problems = nil, nil
		c.forgetIfUnused(cs)
	}
	return cs
}

// build builds the changed services' ports again and assembles the snapshot.
func (c *Cache) build(in Inputs) (*Snapshot, []Problem) {
	c.gen++
	nb := &builder{}
	snap := newSnapshot(nb, in)

	// Services: the changed ones in name order, each one's ports built again.
	keys := make([]nsName, 0, len(c.changed))
	for k := range c.changed {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, compareNames)
	// each key's entry: nil when the service is gone (no Service object)
	entries := make([]*cachedService, len(keys))
	for i, k := range keys {
		if cs := c.services[k]; cs != nil && cs.svc != nil {
			entries[i] = cs
		}
	}
	if len(keys) > 1024 {
		c.changed = map[nsName]struct{}{} // a cleared map keeps its size: don't hold a first build's
	} else {
		clear(c.changed)
	}
	buildPorts(entries)
	var rebuilt []nsName // handed on as snap.Changes
	newPorts, problemsChanged := 0, false
	for i, k := range keys {
		had := false
		if len(c.withProblems) > 0 {
			_, had = c.withProblems[k]
		}
		cs := entries[i]
		if cs == nil { // gone: its ports and problems leave the snapshot
			if had {
				delete(c.withProblems, k)
				problemsChanged = true
			}
			continue
		}
		newPorts += len(cs.ports)
		if len(cs.problems) > 0 {
			c.withProblems[k] = cs
			problemsChanged = true
		} else if had {
			delete(c.withProblems, k)
			problemsChanged = true
		}
		rebuilt = append(rebuilt, k)
	}

	// The service ports: the previous snapshot's, with those of each changed service
	// replaced. A service's ports are next to each other, in the order of the names, so
	// each changed service's place is found by binary search, and what lies between
	// two is copied as it is. Nothing changed: the same array, which no one modifies.
	snap.Services = c.flat
	if len(keys) > 0 {
		old := c.flat
		out := make([]*ServicePort, 0, len(old)+newPorts)
		j := 0
		for ki, k := range keys {
			i := j + sort.Search(len(old)-j, func(x int) bool {
				n := old[j+x].Name
				return compareNames(nsName{n.Namespace, n.Name}, k) >= 0
			})
			out = append(out, old[j:i]...)
			for i < len(old) && old[i].Name.Namespace == k.ns && old[i].Name.Name == k.name {
				i++
			}
			j = i
			if entries[ki] != nil {
				out = appendPointers(out, entries[ki].ports)
			}
		}
		out = append(out, old[j:]...)
		if len(out) == 0 {
			out = nil // as Build, which appends to nil
		}
		c.flat = slices.Clip(out)
		snap.Services = c.flat
	}

	if problemsChanged {
		ps := make([]*cachedService, 0, len(c.withProblems))
		for _, cs := range c.withProblems {
			ps = append(ps, cs)
		}
		slices.SortFunc(ps, func(a, b *cachedService) int { return compareNames(a.key, b.key) })
		c.problems = c.problems[:0] // callers get copies (below)
		for _, cs := range ps {
			c.problems = append(c.problems, cs.problems...)
		}
	}
	// never c.problems' array: callers append to what they get
	problems := append(nb.problems, c.problems...)
	snap.Changes = Changes{cache: c, gen: c.gen, rebuilt: rebuilt}
	return snap, problems
}

// entry returns the cached service of k, creating an empty one.
func (c *Cache) entry(k nsName) *cachedService {
	cs := c.services[k]
	if cs == nil {
		cs = &cachedService{key: k}
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

// parallelBuildMin is the number of changed services from which buildPorts shares them
// among GOMAXPROCS goroutines (a cold start, a resync); fewer are built in turn.
const parallelBuildMin = 2048

// buildPorts builds the ports and problems of each service entry (nil: gone) from its
// Service and EndpointSlices. A build reads only its own objects, which nothing modifies,
// and writes only its own entry, so the entries are built in parallel when there are
// many: the order does not change the result.
func buildPorts(entries []*cachedService) {
	one := func(i int) {
		cs := entries[i]
		if cs == nil {
			return
		}
		b := &builder{}
		ports := b.service(cs.svc, sortedByName(cs.slices))
		slices.SortFunc(ports, func(x, y ServicePort) int { return x.Name.Compare(y.Name) })
		cs.ports, cs.problems = ports, b.problems
	}
	if len(entries) < parallelBuildMin {
		for i := range entries {
			one(i)
		}
		return
	}
	par.Each(len(entries), 256, one)
}

func sortedByName(ss []*discovery.EndpointSlice) []*discovery.EndpointSlice {
	if len(ss) < 2 {
		return ss
	}
	out := slices.Clone(ss)
	slices.SortFunc(out, func(a, b *discovery.EndpointSlice) int { return strings.Compare(a.Name, b.Name) })
	return out
}
