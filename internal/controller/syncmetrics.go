package controller

import (
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nftproxy/nftproxy/internal/conntrack"
	"github.com/nftproxy/nftproxy/internal/metrics"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/source"
	"github.com/nftproxy/nftproxy/nft"
)

// observe records the latency of every trigger a successful sync programmed, at now.
func observe(triggers map[types.NamespacedName][]source.Trigger, rec metrics.Recorder, log logr.Logger, now time.Time) {
	for k, ts := range triggers {
		for _, tr := range ts {
			fam := familyLabel(tr.IPv6)
			rec.Programmed(fam, now.Sub(tr.At))
			log.V(4).Info("Network programming", "service", k.String(), "family", fam, "elapsed", now.Sub(tr.At))
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
func (p *Proxy) syncMetrics(snap *model.Snapshot, triggers map[types.NamespacedName][]source.Trigger) {
	observe(triggers, p.cfg.Metrics, p.log, time.Now())
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
