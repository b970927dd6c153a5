package model

import "slices"

// Categorized are the endpoints one service port may use on this node, kube-proxy's way.
type Categorized struct {
	// Cluster is for traffic under the Cluster policy: ready endpoints (restricted to
	// this node's zone or this node when topology hints say so), or, when none is
	// ready, the serving and terminating ones.
	Cluster []Endpoint
	// Local is for traffic under the Local policy: this node's ready endpoints, or,
	// when none of them is ready, this node's serving and terminating ones.
	Local []Endpoint
	// HasAny reports whether the service has any usable endpoint anywhere: without
	// one its traffic is rejected; with one but none for a Local policy it is dropped.
	HasAny bool
}

// UsesClusterEndpoints: cluster-wide endpoints are needed for internal traffic under
// the Cluster policy, and for any externally accessible service (pods and the node
// reach its external addresses through the cluster endpoints).
func (sp *ServicePort) UsesClusterEndpoints() bool {
	return !sp.InternalPolicyLocal || sp.ExternallyAccessible()
}

// UsesLocalEndpoints: a Local policy for internal or external traffic.
func (sp *ServicePort) UsesLocalEndpoints() bool {
	return sp.InternalPolicyLocal || sp.ExternalPolicyLocal
}

// Categorize splits endpoints (of one address family) for a service port on node.
func Categorize(sp *ServicePort, eps []Endpoint, node Node) Categorized {
	var c Categorized
	if sp.UsesClusterEndpoints() {
		mode := topologyMode(eps, node)
		if mode == topologyNone {
			c.Cluster = UsableEndpoints(eps, nil)
		} else {
			c.Cluster = UsableEndpoints(eps, func(e Endpoint) bool { return mode.allows(e, node) })
		}
		c.HasAny = len(c.Cluster) > 0
	}
	if !sp.UsesLocalEndpoints() {
		return c
	}
	c.HasAny = c.HasAny || slices.ContainsFunc(eps, Endpoint.usable)
	c.Local = UsableEndpoints(eps, func(e Endpoint) bool { return e.NodeName == node.Name && node.Name != "" })
	return c
}

// topology is the hint-based restriction in force for a service on this node.
type topology uint8

const (
	topologyNone topology = iota
	topologySameNode
	topologySameZone
)

func (t topology) allows(e Endpoint, node Node) bool {
	switch t {
	case topologySameNode:
		return slices.Contains(e.NodeHints(), node.Name)
	case topologySameZone:
		return slices.Contains(e.ZoneHints(), node.Zone)
	}
	return true
}

// topologyMode applies hints only when every ready endpoint carries them and at least
// one is for this node (or its zone); node hints take precedence over zone hints.
func topologyMode(eps []Endpoint, node Node) topology {
	anyReady := false
	allNode, forNode := true, false
	allZone, forZone := true, false
	for _, e := range eps {
		if !e.Ready {
			continue
		}
		anyReady = true
		if len(e.NodeHints()) == 0 {
			allNode = false
		} else if slices.Contains(e.NodeHints(), node.Name) {
			forNode = true
		}
		if len(e.ZoneHints()) == 0 {
			allZone = false
		} else if slices.Contains(e.ZoneHints(), node.Zone) {
			forZone = true
		}
	}
	switch {
	case !anyReady:
		return topologyNone
	case allNode && forNode:
		return topologySameNode
	case allZone && forZone:
		return topologySameZone
	}
	return topologyNone
}

// filter returns the endpoints keep accepts; when it accepts all (the common case) it
// returns eps itself, without copying.
func filter(eps []Endpoint, keep func(Endpoint) bool) []Endpoint {
	for i, e := range eps {
		if keep(e) {
			continue
		}
		out := append(make([]Endpoint, 0, len(eps)-1), eps[:i]...)
		for _, e := range eps[i+1:] {
			if keep(e) {
				out = append(out, e)
			}
		}
		if len(out) == 0 {
			return nil
		}
		return out
	}
	return eps
}
