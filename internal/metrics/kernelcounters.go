package metrics

import (
	"strings"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

// KernelCounters is the CounterSource of an Applier's tables (compile.TableName in each
// family): the elements of the service and node port counter sets, attributed to their
// service port by key through the part that added them (kernel.CountersByOwner), and
// the reject chain's counter.
func KernelCounters(a *kernel.Applier, families []nft.Family) CounterSource {
	return func() ([]ServicePortCount, uint64, error) {
		var ports []ServicePortCount
		var rejects uint64
		for _, fam := range families {
			counts, _, err := a.CountersByOwner(fam, compile.TableName, compile.SetServiceCounters, compile.SetNodePortCounters)
			if err != nil {
				return nil, 0, err
			}
			for _, c := range counts {
				if sp, ok := ServicePortOfOwner(c.Owner); ok {
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

// ServicePortOfOwner returns the service port whose nft.Part has this owner. The
// compiler names a service port's part compile.ChainName("port", name); the answer is
// checked by naming it again, so a name that does not come from there is refused
// rather than misread. (A typed owner in nft.Part, or the inverse exported by the
// compiler, would make this unnecessary.)
func ServicePortOfOwner(owner string) (model.ServicePortName, bool) {
	rest, ok := strings.CutPrefix(owner, "port-")
	if !ok {
		return model.ServicePortName{}, false
	}
	f := strings.Split(rest, "/")
	if len(f) != 4 {
		return model.ServicePortName{}, false
	}
	sp := model.ServicePortName{Namespace: f[0], Name: f[1], Port: f[3]}
	if sp.Port == "-" {
		sp.Port = ""
	}
	for _, p := range []uint8{model.ProtoTCP, model.ProtoUDP, model.ProtoSCTP} {
		if strings.EqualFold(f[2], model.ProtoString(p)) {
			sp.Protocol = p
		}
	}
	if compile.ChainName("port", sp) != owner {
		return model.ServicePortName{}, false
	}
	return sp, true
}
