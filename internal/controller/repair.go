package controller

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
