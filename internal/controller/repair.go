package controller

import (
	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

// RequestRepair asks for a sync that rewrites the whole table from scratch, as soon as
// the runner allows. It is safe to call from any goroutine: the dataplane is only ever
// touched by the sync goroutine, which takes the request in takeRepair.
func (p *Proxy) RequestRepair(reason string) {
	p.mu.Lock()
	if p.repairReason == "" {
		p.repairReason = reason
	}
	p.mu.Unlock()
	p.runner.Request()
}

// takeRepair returns the pending repair request's reason and clears it; "" if none.
func (p *Proxy) takeRepair() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.repairReason
	p.repairReason = ""
	return r
}

// DataplaneChanged is the nftables monitor's callback (kernel.Monitor): another
// process changed our tables, or change events were lost. It logs the change, counts
// it in nftproxy_dataplane_repairs_total and requests a repair, which the next sync
// (within --min-sync-period) makes by rewriting the whole table in one transaction.
func (p *Proxy) DataplaneChanged(c kernel.Change) {
	p.log.Info("nftables tables changed by someone else; repairing", "reason", c.Reason, "eventsLost", c.Lost)
	p.cfg.Metrics.Repaired(c.Lost)
	p.RequestRepair(c.Reason)
}

// Tables are nftproxy's tables, one per family in Families: what the monitor watches.
func Tables() []kernel.TableID {
	out := make([]kernel.TableID, 0, len(Families))
	for _, fam := range Families {
		out = append(out, kernel.TableID{Family: fam, Name: compile.TableName})
	}
	return out
}
