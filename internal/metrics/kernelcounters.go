package metrics

import (
	"sync"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/purpose"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

// KernelCounters is the CounterSource of an Applier's tables (compile.TableName in each
// family): the elements of the service and node port counter sets, attributed by key to
// the part that added them (kernel.CountersByOwner), and that part to its service port
// through its tag in the rulesets the Applier last wrote (kernel.Applier.Applied); and
// the reject chain's counter. No name or comment is parsed.
func KernelCounters(a *kernel.Applier, families []nft.Family) CounterSource {
	parts := PartsOf(a.Applied)
	return func() ([]ServicePortCount, uint64, error) {
		var ports []ServicePortCount
		var rejects uint64
		for _, fam := range families {
			counts, _, err := a.CountersByOwner(fam, compile.TableName, compile.SetServiceCounters, compile.SetNodePortCounters)
			if err != nil {
				return nil, 0, err
			}
			for _, c := range counts {
				if sp, ok := parts.ServicePort(fam, c.Owner); ok {
					ports = append(ports, ServicePortCount{Port: sp, Packets: c.Packets, Bytes: c.Bytes})
				}
			}
			r, err := a.RuleCounts(fam, compile.TableName, compile.ChainReject)
			if err != nil {
				return nil, 0, err
			}
			for _, c := range r {
				rejects += c.Packets
			}
		}
		return ports, rejects, nil
	}
}

// AppliedParts maps the parts of nftproxy's tables (compile.TableName) as last applied,
// by owner key, to the service ports their tags name (purpose.ServicePortOf). What was
// applied is the Applier's (kernel.Applier.Applied): AppliedParts keeps no copy, only
// an index of the snapshot it last read, rebuilt when the snapshot changes. A part's
// owner key names one service port for as long as it exists, so a read racing an
// Apply still attributes every part it finds correctly.
type AppliedParts struct {
	applied func() *kernel.Applied

	mu      sync.Mutex
	indexed *kernel.Applied
	index   map[nft.Family]map[string]model.ServicePortName
}

// PartsOf returns the AppliedParts of the snapshots applied returns (an Applier's
// Applied method).
func PartsOf(applied func() *kernel.Applied) *AppliedParts {
	return &AppliedParts{applied: applied}
}

// ServicePort returns the service port of the part with this owner key in the family's
// last applied ruleset; false if there is none (or the part has no service port tag).
func (ap *AppliedParts) ServicePort(fam nft.Family, owner string) (model.ServicePortName, bool) {
	if ap == nil || ap.applied == nil {
		return model.ServicePortName{}, false
	}
	ap.mu.Lock()
	defer ap.mu.Unlock()
	if p := ap.applied(); p != ap.indexed || ap.index == nil {
		ap.indexed, ap.index = p, map[nft.Family]map[string]model.ServicePortName{}
		for _, rs := range p.Rulesets() {
			if rs.Table != compile.TableName {
				continue
			}
			m := make(map[string]model.ServicePortName, len(rs.Parts))
			for _, part := range rs.Parts {
				if sp, ok := purpose.ServicePortOf(part.Tag); ok {
					m[part.Owner] = sp
				}
			}
			ap.index[rs.Family] = m
		}
	}
	sp, ok := ap.index[fam][owner]
	return sp, ok
}
