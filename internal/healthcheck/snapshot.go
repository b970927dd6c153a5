package healthcheck

import (
	"net/netip"

	"github.com/nftproxy/nftproxy/internal/model"
)

// FromSnapshot returns the health checks snap needs: one per service with a
// healthCheckNodePort (externalTrafficPolicy Local load balancers), counting the ready
// endpoints on snap's node the way kube-proxy does: distinct addresses over all the
// service's ports, so that a pod serving two ports counts once. Terminating endpoints
// do not count, even while they serve: a node left with only those should lose its
// traffic.
//
// kube-proxy runs one health-check server per address family, each counting its own
// family; one server answers both here, with the larger of the two counts, which is
// the same answer when (as usual) every local pod has an address in each family.
func FromSnapshot(snap *model.Snapshot) map[ServiceName]Service {
	out := map[ServiceName]Service{}
	local := map[ServiceName]map[netip.Addr]bool{}
	for _, sp := range snap.Services {
		if sp.HealthCheckNodePort == 0 {
			continue
		}
		name := ServiceName{Namespace: sp.Name.Namespace, Name: sp.Name.Name}
		if local[name] == nil {
			local[name] = map[netip.Addr]bool{}
		}
		for _, e := range sp.Endpoints {
			if e.Ready && isLocal(e, snap.Node) {
				local[name][e.Addr] = true
			}
		}
		out[name] = Service{Port: sp.HealthCheckNodePort, LocalEndpoints: perFamilyMax(local[name])}
	}
	return out
}

func isLocal(e model.Endpoint, node model.Node) bool {
	return node.Name != "" && e.NodeName == node.Name
}

// perFamilyMax is the larger of the number of IPv4 and of IPv6 addresses.
func perFamilyMax(addrs map[netip.Addr]bool) int {
	var v4, v6 int
	for a := range addrs {
		if a.Is6() {
			v6++
		} else {
			v4++
		}
	}
	return max(v4, v6)
}
