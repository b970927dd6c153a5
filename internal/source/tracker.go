package source

import (
	"sync"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
)

// Kind says what an informer watches, for the change tracker.
type Kind int

const (
	Other          Kind = iota // the Node, ServiceCIDRs: read whole every sync (one, or few)
	Services                   // Services: tracked by name
	EndpointSlices             // EndpointSlices: tracked by name, with their trigger times
)

// TriggerTimeAnnotation is the annotation the EndpointSlice controller sets on every
// slice it writes: when the change it reflects (a pod or the Service) happened. Network
// programming latency is measured from it, as kube-proxy does.
const TriggerTimeAnnotation = v1.EndpointsLastChangeTriggerTime

// maxTriggersPerService bounds the trigger times one Service keeps between syncs (while
// syncs fail, a busy Service could otherwise pile them up); the oldest are kept, so the
// worst latency is still seen.
const maxTriggersPerService = 64

// Trigger is one EndpointSlice change to time: its family and trigger time.
type Trigger struct {
	IPv6 bool
	At   time.Time
}

// Changes are what changed in the API since a sync last took them (Tracker.Take).
//
// The names are informer keys ("namespace/name"); a sync reads each one's object when it
// takes them (Source.Delta), so a name that changed several times counts once, and an
// object that changes after being read has its name noted again by the event handler
// (an informer updates its cache before it reports the change).
type Changes struct {
	// Full: build the model from scratch, from the full lists (Source.Lists). Set until
	// the first sync, and from the moment a sync takes the names until it says the
	// model has them (Done): a sync that panicked may have left the model cache half
	// updated.
	Full     bool
	Services map[string]struct{}
	Slices   map[string]struct{}
	// Triggers are the trigger times of the EndpointSlice changes, per Service, to be
	// timed when a sync programs them: a change from before the proxy started is not
	// timed (the list at start carries old times), and a deleted slice drops its
	// Service's times (its annotation tells when it was last written, not when it was
	// deleted).
	Triggers map[types.NamespacedName][]Trigger
	// Since is when the first of these changes (of any object, the Node and
	// ServiceCIDRs too) arrived; zero if none did.
	Since time.Time
}

// Tracker collects the changes the informers report until a sync takes them, as
// kube-proxy's change trackers do: the names of the changed Services and
// EndpointSlices, so that a sync hands the model cache just those objects instead of
// listing all of them (with 30,000 Services the lists alone cost more than the rest of
// the model's work); the trigger times of the slices' changes; and when the oldest
// change not yet programmed arrived, for health.
//
// A sync takes the changes (Take), says when the model has the names (Done), and gives
// back what it could not program (GiveBack).
type Tracker struct {
	log   logr.Logger
	start time.Time

	mu      sync.Mutex
	pending Changes
}

// NewTracker returns a tracker whose first Take says Full; trigger times from before
// start are not timed.
func NewTracker(log logr.Logger, start time.Time) *Tracker {
	t := &Tracker{log: log, start: start}
	t.pending = t.empty(true)
	return t
}

func (t *Tracker) empty(full bool) Changes {
	return Changes{Full: full, Services: map[string]struct{}{}, Slices: map[string]struct{}{},
		Triggers: map[types.NamespacedName][]Trigger{}}
}

// Add notes an informer event about obj, of an informer of kind k (obj may be a
// cache.DeletedFinalStateUnknown, whose key is the name of an object deleted while the
// informer was not watching).
func (t *Tracker) Add(k Kind, obj any, deleted bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pending.Since.IsZero() {
		t.pending.Since = time.Now()
	}
	switch k {
	case Services:
		if key, ok := keyOf(obj); ok {
			t.pending.Services[key] = struct{}{}
		}
	case EndpointSlices:
		if key, ok := keyOf(obj); ok {
			t.pending.Slices[key] = struct{}{}
		}
		t.trigger(obj, deleted)
	}
}

// keyOf is obj's informer key; false if obj is not an API object (an informer does not
// report those).
func keyOf(obj any) (string, bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return d.Key, true
	}
	key, err := cache.MetaNamespaceKeyFunc(obj)
	return key, err == nil
}

// trigger notes a slice event's trigger time (t.mu held).
func (t *Tracker) trigger(obj any, deleted bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj, deleted = d.Obj, true
	}
	s, ok := obj.(*discovery.EndpointSlice)
	if !ok {
		return
	}
	svc := s.Labels[discovery.LabelServiceName]
	if svc == "" {
		return
	}
	key := types.NamespacedName{Namespace: s.Namespace, Name: svc}
	if deleted {
		delete(t.pending.Triggers, key)
		return
	}
	var v6 bool
	switch s.AddressType {
	case discovery.AddressTypeIPv4:
	case discovery.AddressTypeIPv6:
		v6 = true
	default:
		return
	}
	at, ok := t.parse(s)
	if !ok {
		return
	}
	if len(t.pending.Triggers[key]) < maxTriggersPerService {
		t.pending.Triggers[key] = append(t.pending.Triggers[key], Trigger{v6, at})
	}
}

// Take returns the changes noted since the last Take; the next Take says Full until
// Done or GiveBack.
func (t *Tracker) Take() Changes {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.pending
	t.pending = t.empty(true)
	return c
}

// Done says the model has the names c holds: the next Take does not say Full, and c
// keeps only its trigger times and Since, for the sync to time or give back.
func (t *Tracker) Done(c *Changes) {
	t.mu.Lock()
	t.pending.Full = false
	t.mu.Unlock()
	c.Full, c.Services, c.Slices = false, nil, nil
}

// GiveBack returns what a sync took and could not program: its names (handing the model
// a name again does no harm, it reads the object as it is then) and Full as they were,
// its trigger times before those noted since, and its Since if older.
func (t *Tracker) GiveBack(c Changes) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k := range c.Services {
		t.pending.Services[k] = struct{}{}
	}
	for k := range c.Slices {
		t.pending.Slices[k] = struct{}{}
	}
	t.pending.Full = c.Full
	for k, ts := range c.Triggers {
		ts = append(ts, t.pending.Triggers[k]...)
		t.pending.Triggers[k] = ts[:min(len(ts), maxTriggersPerService)]
	}
	if t.pending.Since.IsZero() || (!c.Since.IsZero() && c.Since.Before(t.pending.Since)) {
		t.pending.Since = c.Since
	}
}

// Oldest is when the oldest change not yet taken arrived; zero if none.
func (t *Tracker) Oldest() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pending.Since
}

// timed tells whether a slice's trigger time can be timed (see parse): slim keeps it only
// then. A trigger time costs a one-entry map (344 bytes) per slice; the list at start,
// whose times are all older, keeps none.
func (t *Tracker) timed(s *discovery.EndpointSlice) bool {
	_, ok := t.parse(s)
	return ok
}

// parse reads a slice's trigger time; ok is false when there is none, it is not valid
// (logged) or it is not after the proxy started.
func (t *Tracker) parse(s *discovery.EndpointSlice) (at time.Time, ok bool) {
	v, ok := s.Annotations[TriggerTimeAnnotation]
	if !ok {
		return at, false
	}
	at, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		t.log.V(1).Info("Ignoring an EndpointSlice's unparsable trigger time; its change is not timed",
			"namespace", s.Namespace, "name", s.Name, "annotation", TriggerTimeAnnotation, "value", v)
		return at, false
	}
	return at, at.After(t.start)
}
