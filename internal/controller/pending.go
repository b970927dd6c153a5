package controller

import (
	"sync"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/nftproxy/nftproxy/internal/model"
)

// kind says what an informer watches, for the pending changes.
type kind int

const (
	otherKind   kind = iota // the Node, ServiceCIDRs: read whole every sync (one, or few)
	serviceKind             // Services: pending by name
	sliceKind               // EndpointSlices: pending by name
)

// pending holds the names of the Services and EndpointSlices the informers reported
// changed since the model cache last took them. A sync hands the model cache just
// those objects, as the informer caches have them then, instead of listing all of them:
// with 30,000 Services the lists alone cost more than the rest of the model's work.
//
// The names are informer keys ("namespace/name"); a sync reads each one's object when it
// takes them, so a name that changed several times counts once, and an object that
// changes after being read has its name noted again by the event handler (an informer
// updates its cache before it reports the change).
type pending struct {
	mu       sync.Mutex
	services map[string]struct{}
	slices   map[string]struct{}
	// full: the next sync builds the model from scratch (a new cache, the full lists).
	// Set until the first sync, and from the moment a sync takes the names until it
	// says the model has them (done): a sync that panicked may have left the model cache
	// half updated.
	full bool
}

// takenChanges are the names a sync took.
type takenChanges struct {
	services, slices map[string]struct{}
	full             bool
}

func newPending() *pending {
	return &pending{services: map[string]struct{}{}, slices: map[string]struct{}{}, full: true}
}

// add notes obj's name (obj may be a cache.DeletedFinalStateUnknown, whose key is the
// name of an object deleted while the informer was not watching).
func (pc *pending) add(k kind, obj any) {
	if k == otherKind {
		return
	}
	var key string
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		key = d.Key
	} else {
		var err error
		if key, err = cache.MetaNamespaceKeyFunc(obj); err != nil {
			return // not an API object: an informer does not report those
		}
	}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if k == serviceKind {
		pc.services[key] = struct{}{}
	} else {
		pc.slices[key] = struct{}{}
	}
}

// take returns the names noted since the last take; the next take says full until done
// or giveBack.
func (pc *pending) take() takenChanges {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	t := takenChanges{services: pc.services, slices: pc.slices, full: pc.full}
	pc.services, pc.slices, pc.full = map[string]struct{}{}, map[string]struct{}{}, true
	return t
}

// done says the model cache has what the last take returned.
func (pc *pending) done() {
	pc.mu.Lock()
	pc.full = false
	pc.mu.Unlock()
}

// giveBack returns what a sync took and could not hand the model cache. Handing it a
// name again does no harm (it reads the object as it is then), so a sync that fails
// after the cache took the names may give them back too.
func (pc *pending) giveBack(t takenChanges) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	for k := range t.services {
		pc.services[k] = struct{}{}
	}
	for k := range t.slices {
		pc.slices[k] = struct{}{}
	}
	pc.full = t.full
}

// delta reads the objects of the taken names from the informer caches: an object that
// is not there any more is deleted.
func (p *Proxy) delta(t takenChanges) (model.Delta, error) {
	d := model.Delta{Services: make(map[types.NamespacedName]*v1.Service, len(t.services)),
		Slices: make(map[types.NamespacedName]*discovery.EndpointSlice, len(t.slices))}
	for key := range t.services {
		ns, name, err := cache.SplitMetaNamespaceKey(key)
		if err != nil {
			continue // not a key MetaNamespaceKeyFunc makes
		}
		svc, err := p.services.Services(ns).Get(name)
		if err != nil && !apierrors.IsNotFound(err) {
			return model.Delta{}, err
		}
		d.Services[types.NamespacedName{Namespace: ns, Name: name}] = svc // nil if not found
	}
	for key := range t.slices {
		ns, name, err := cache.SplitMetaNamespaceKey(key)
		if err != nil {
			continue
		}
		s, err := p.slices.EndpointSlices(ns).Get(name)
		if err != nil && !apierrors.IsNotFound(err) {
			return model.Delta{}, err
		}
		d.Slices[types.NamespacedName{Namespace: ns, Name: name}] = s
	}
	return d, nil
}
