package controller

import (
	"sync"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/nftproxy/nftproxy/internal/conntrack"
	"github.com/nftproxy/nftproxy/internal/metrics"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/nft"
)

// TriggerTimeAnnotation is the annotation the EndpointSlice controller sets on every
// slice it writes: when the change it reflects (a pod or the Service) happened. Network
// programming latency is measured from it, as kube-proxy does.
const TriggerTimeAnnotation = v1.EndpointsLastChangeTriggerTime

// timed tells whether a slice's trigger time can be timed (see parse): slim keeps it only
// then. A trigger time costs a one-entry map (344 bytes) per slice; the list at start,
// whose times are all older, keeps none.
func (t *triggers) timed(s *discovery.EndpointSlice) bool {
	_, ok := t.parse(s)
	return ok
}

// parse reads a slice's trigger time; ok is false when there is none, it is not valid
// (logged) or it is not after the proxy started.
func (t *triggers) parse(s *discovery.EndpointSlice) (at time.Time, ok bool) {
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

// maxTriggersPerService bounds the trigger times one Service keeps between syncs (while
// syncs fail, a busy Service could otherwise pile them up); the oldest are kept, so the
// worst latency is still seen.
const maxTriggersPerService = 64

// trigger is one EndpointSlice change to time: its family and trigger time.
type trigger struct {
	family string // metrics.IPv4 or metrics.IPv6
	at     time.Time
}

// triggers collects the trigger times of EndpointSlice changes until a sync programs
// them, per Service, as kube-proxy's endpoints change tracker does: a change from before
// the proxy started is not timed (the list at start carries old times), and a deleted
// slice drops its Service's pending times (its annotation tells when it was last
// written, not when it was deleted).
type triggers struct {
	log   logr.Logger
	start time.Time

	mu      sync.Mutex
	pending map[types.NamespacedName][]trigger
}

func newTriggers(log logr.Logger, start time.Time) *triggers {
	return &triggers{log: log, start: start, pending: map[types.NamespacedName][]trigger{}}
}

// sliceEvent notes an informer event; objects other than EndpointSlices are ignored.
func (t *triggers) sliceEvent(obj any, deleted bool) {
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
		t.mu.Lock()
		delete(t.pending, key)
		t.mu.Unlock()
		return
	}
	var family string
	switch s.AddressType {
	case discovery.AddressTypeIPv4:
		family = metrics.IPv4
	case discovery.AddressTypeIPv6:
		family = metrics.IPv6
	default:
		return
	}
	at, ok := t.parse(s)
	if !ok {
		return
	}
	t.mu.Lock()
	if len(t.pending[key]) < maxTriggersPerService {
		t.pending[key] = append(t.pending[key], trigger{family, at})
	}
	t.mu.Unlock()
}

// take hands the pending trigger times to a sync.
func (t *triggers) take() map[types.NamespacedName][]trigger {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.pending) == 0 {
		return nil
	}
	taken := t.pending
	t.pending = map[types.NamespacedName][]trigger{}
	return taken
}

// giveBack returns the trigger times of a failed sync: the next successful one
// programs them.
func (t *triggers) giveBack(taken map[types.NamespacedName][]trigger) {
	if len(taken) == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, ts := range taken {
		ts = append(ts, t.pending[k]...)
		t.pending[k] = ts[:min(len(ts), maxTriggersPerService)]
	}
}

// observe records the latency of every trigger a successful sync programmed, at now.
func (t *triggers) observe(taken map[types.NamespacedName][]trigger, rec metrics.Recorder, now time.Time) {
	for k, ts := range taken {
		for _, tr := range ts {
			rec.Programmed(tr.family, now.Sub(tr.at))
			t.log.V(4).Info("Network programming", "service", k.String(), "family", tr.family, "elapsed", now.Sub(tr.at))
		}
	}
}

// noLocalEndpoints counts, per family, the service ports with a Local internal or
// external traffic policy that have usable endpoints but none on this node: their
// traffic of that kind is dropped (kube-proxy's
// kubeproxy_sync_proxy_rules_no_local_endpoints_total). A service port belongs to the
// families of its cluster IPs; a port without any usable endpoint rejects, and is not
// counted.
func noLocalEndpoints(snap *model.Snapshot) map[string][2]int {
	out := map[string][2]int{metrics.IPv4: {}, metrics.IPv6: {}}
	for _, sp := range snap.Services {
		if !sp.InternalPolicyLocal && !sp.ExternalPolicyLocal {
			continue
		}
		for _, v6 := range []bool{false, true} {
			if len(model.AddrsOf(sp.ClusterIPs, v6)) == 0 {
				continue
			}
			var eps []model.Endpoint
			for _, e := range sp.Endpoints {
				if e.Addr.Is6() == v6 {
					eps = append(eps, e)
				}
			}
			cat := model.Categorize(sp, eps, snap.Node)
			if !cat.HasAny || len(cat.Local) > 0 {
				continue
			}
			fam := familyLabel(v6)
			n := out[fam]
			if sp.InternalPolicyLocal {
				n[0]++
			}
			if sp.ExternalPolicyLocal {
				n[1]++
			}
			out[fam] = n
		}
	}
	return out
}

func familyLabel(v6 bool) string {
	if v6 {
		return metrics.IPv6
	}
	return metrics.IPv4
}

// syncMetrics reports what a successful sync programmed: the network programming
// latency of the EndpointSlice changes it took, the service ports without local
// endpoints, and the Services each family's table left out for the limits.
func (p *Proxy) syncMetrics(snap *model.Snapshot, taken map[types.NamespacedName][]trigger) {
	p.triggers.observe(taken, p.cfg.Metrics, time.Now())
	for fam, n := range noLocalEndpoints(snap) {
		p.cfg.Metrics.NoLocalEndpoints(fam, n[0], n[1])
	}
	for fam, n := range p.pipeline.SetAside() {
		p.cfg.Metrics.SetAside(familyLabel(fam == nft.IPv6), n)
	}
}

// conntrackCleaner is the stale UDP entry cleaner, reporting each family's run to the
// metrics.
func (p *Proxy) conntrackCleaner() *conntrack.Cleaner {
	return &conntrack.Cleaner{Deleter: p.cfg.Conntrack, Observe: func(v6 bool, took time.Duration, deleted int) {
		p.cfg.Metrics.ConntrackReconciled(familyLabel(v6), took, deleted)
	}}
}
