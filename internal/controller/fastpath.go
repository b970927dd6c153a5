package controller

import (
	"errors"

	v1 "k8s.io/api/core/v1"

	"github.com/nftproxy/nftproxy/internal/pipeline"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

// flowtableProber is a dataplane that can tell whether the kernel has flowtables
// (*kernel.Applier).
type flowtableProber interface {
	ProbeFlowtables(fam nft.Family) error
}

// probeFastPath asks the kernel once, before the first sync with
// --fast-path-interfaces, whether it creates flowtables (a build option, not a kernel
// release). When it refuses, the fast path is turned off for the proxy's lifetime with
// one log line and a Warning event on the Node, and every sync programs everything
// else: no sync carries a flowtable the kernel would refuse, so nothing is retried.
func (p *Proxy) probeFastPath() {
	if p.fastPathProbed || len(p.cfg.Pipeline.FastPathInterfaces) == 0 {
		return
	}
	pr, ok := p.dataplane.(flowtableProber)
	if !ok {
		p.fastPathProbed = true
		return
	}
	for _, fam := range pipeline.Families {
		err := pr.ProbeFlowtables(fam)
		var rejected *kernel.RejectedError
		switch {
		case err == nil:
			continue
		case !errors.As(err, &rejected):
			return // not the kernel's answer (a socket error): asked again at the next sync
		}
		p.fastPathProbed = true
		const msg = "The kernel cannot create nf_tables flowtables (it needs CONFIG_NF_FLOW_TABLE and nf_flow_table_inet); the fast path for established flows (--fast-path-interfaces) is off, everything else is programmed"
		p.log.Error(err, msg, "family", fam)
		if node := p.src.Node(); node != nil && p.recorder != nil {
			p.recorder.Event(node, v1.EventTypeWarning, "NftproxyFastPathUnavailable", msg)
		}
		p.cfg.Pipeline.FastPathInterfaces = nil
		return
	}
	p.fastPathProbed = true
}
