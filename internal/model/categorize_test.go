package model_test

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/model"
)

// ---- endpoint builders for Categorize --------------------------------------------------

type catOpt func(*model.Endpoint)

// catEP is endpoint 10.1.0.<n>:80. flags spell the conditions as in dumpEndpoint: "RS-"
// is ready, serving, not terminating; "-ST" is serving and terminating; "---" is none.
func catEP(n byte, flags string, opts ...catOpt) model.Endpoint {
	ep := model.Endpoint{
		Addr: netip.AddrFrom4([4]byte{10, 1, 0, n}), Port: 80,
		Ready: flags[0] == 'R', Serving: flags[1] == 'S', Terminating: flags[2] == 'T',
	}
	for _, o := range opts {
		o(&ep)
	}
	return ep
}

// catOn places the endpoint on a node.
func catOn(node string) catOpt { return func(e *model.Endpoint) { e.NodeName = node } }

// catZones sets hints.forZones.
func catZones(zones ...string) catOpt {
	return func(e *model.Endpoint) { e.Hints = &model.Hints{Zones: zones, Nodes: e.NodeHints()} }
}

// catNodes sets hints.forNodes.
func catNodes(nodes ...string) catOpt {
	return func(e *model.Endpoint) { e.Hints = &model.Hints{Zones: e.ZoneHints(), Nodes: nodes} }
}

// catEPs lists endpoints as address:port, in order.
func catEPs(eps []model.Endpoint) string {
	s := make([]string, len(eps))
	for i, e := range eps {
		s[i] = e.AddrPort().String()
	}
	return strings.Join(s, ",")
}

// catWant renders expected last octets the way catEPs renders endpoints.
func catWant(ns []byte) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, 0, n}), 80).String()
	}
	return strings.Join(s, ",")
}

// ---- Categorize --------------------------------------------------------------------------

func TestCategorize(t *testing.T) {
	const (
		self  = "node-a" // the node Categorize runs for
		other = "node-b"
		third = "node-c"
	)
	here := model.Node{Name: self, Zone: "zone-a"}
	vip := netip.MustParseAddr("10.96.0.10")
	ext := netip.MustParseAddr("203.0.113.7")
	lb := netip.MustParseAddr("198.51.100.7")

	// Service ports under each policy combination. ExternalPolicyLocal is only ever set
	// on an externally accessible port, as Build does.
	clusterPolicy := model.ServicePort{ClusterIPs: []netip.Addr{vip}, Port: 80}
	itpLocal := model.ServicePort{ClusterIPs: []netip.Addr{vip}, Port: 80, InternalPolicyLocal: true}
	etpLocal := model.ServicePort{ClusterIPs: []netip.Addr{vip}, Port: 80, NodePort: 30080, ExternalPolicyLocal: true}
	etpLocalLB := model.ServicePort{ClusterIPs: []netip.Addr{vip}, Port: 80, LoadBalancerIPs: []netip.Addr{lb}, ExternalPolicyLocal: true}
	etpLocalExtIP := model.ServicePort{ClusterIPs: []netip.Addr{vip}, Port: 80, ExternalIPs: []netip.Addr{ext}, ExternalPolicyLocal: true}
	itpLocalNodePort := model.ServicePort{ClusterIPs: []netip.Addr{vip}, Port: 80, NodePort: 30080, InternalPolicyLocal: true}
	bothLocal := model.ServicePort{ClusterIPs: []netip.Addr{vip}, Port: 80, NodePort: 30080, InternalPolicyLocal: true, ExternalPolicyLocal: true}
	clusterNodePort := model.ServicePort{ClusterIPs: []netip.Addr{vip}, Port: 80, NodePort: 30080}

	for _, tc := range []struct {
		name    string
		sp      model.ServicePort
		node    *model.Node // nil: here
		eps     []model.Endpoint
		cluster []byte // last octets of the expected Cluster endpoints, in order
		local   []byte // likewise for Local
		hasAny  bool
	}{
		// -- Cluster policy: ready, then serving+terminating --------------------------------
		{
			name: "cluster policy, no endpoints",
			sp:   clusterPolicy,
		},
		{
			name:    "cluster policy, all ready",
			sp:      clusterPolicy,
			eps:     []model.Endpoint{catEP(1, "RS-", catOn(self)), catEP(2, "RS-", catOn(other)), catEP(3, "RS-")},
			cluster: []byte{1, 2, 3},
			hasAny:  true,
		},
		{
			name: "cluster policy, some not ready: only the ready ones, terminating ones not mixed in",
			sp:   clusterPolicy,
			eps: []model.Endpoint{
				catEP(1, "---", catOn(self)), catEP(2, "RS-", catOn(other)), catEP(3, "-ST", catOn(self)),
				catEP(4, "RS-", catOn(third)), catEP(5, "-S-"),
			},
			cluster: []byte{2, 4},
			hasAny:  true,
		},
		{
			name: "cluster policy, none ready: serving and terminating ones, wherever they are",
			sp:   clusterPolicy,
			eps: []model.Endpoint{
				catEP(1, "-ST", catOn(other)), catEP(2, "--T", catOn(self)), catEP(3, "---"), catEP(4, "-ST", catOn(self)),
			},
			cluster: []byte{1, 4},
			hasAny:  true,
		},
		{
			name:   "cluster policy, none serving: nothing usable",
			sp:     clusterPolicy,
			eps:    []model.Endpoint{catEP(1, "---", catOn(self)), catEP(2, "--T", catOn(other)), catEP(3, "-S-")},
			hasAny: false,
		},
		{
			name:    "cluster policy does not compute Local even with local endpoints",
			sp:      clusterPolicy,
			eps:     []model.Endpoint{catEP(1, "RS-", catOn(self)), catEP(2, "RS-", catOn(other))},
			cluster: []byte{1, 2},
			hasAny:  true,
		},
		{
			name:    "ETP Cluster on a node port: Local not computed",
			sp:      clusterNodePort,
			eps:     []model.Endpoint{catEP(1, "RS-", catOn(self)), catEP(2, "RS-", catOn(other))},
			cluster: []byte{1, 2},
			hasAny:  true,
		},

		// -- internalTrafficPolicy Local ------------------------------------------------------
		{
			name:   "ITP Local, local and remote ready: Local has the local ones, Cluster not computed",
			sp:     itpLocal,
			eps:    []model.Endpoint{catEP(1, "RS-", catOn(self)), catEP(2, "RS-", catOn(other)), catEP(3, "RS-", catOn(self))},
			local:  []byte{1, 3},
			hasAny: true,
		},
		{
			name:   "ITP Local, none local: Local empty but HasAny from the remote ones",
			sp:     itpLocal,
			eps:    []model.Endpoint{catEP(1, "RS-", catOn(other)), catEP(2, "RS-", catOn(third))},
			hasAny: true,
		},
		{
			name:   "ITP Local, only remote serving+terminating: HasAny from the scan",
			sp:     itpLocal,
			eps:    []model.Endpoint{catEP(1, "-ST", catOn(other)), catEP(2, "---", catOn(self))},
			hasAny: true,
		},
		{
			name:   "ITP Local, no endpoints",
			sp:     itpLocal,
			hasAny: false,
		},
		{
			name:   "ITP Local, only unusable endpoints (local not serving, remote not ready)",
			sp:     itpLocal,
			eps:    []model.Endpoint{catEP(1, "--T", catOn(self)), catEP(2, "-S-", catOn(other)), catEP(3, "---", catOn(self))},
			hasAny: false,
		},
		{
			name: "ITP Local, local only terminating while remote ready: Local falls back on its own",
			sp:   itpLocal,
			eps: []model.Endpoint{
				catEP(1, "RS-", catOn(other)), catEP(2, "-ST", catOn(self)), catEP(3, "--T", catOn(self)), catEP(4, "-ST", catOn(self)),
			},
			local:  []byte{2, 4},
			hasAny: true,
		},
		{
			name: "ITP Local, local ready and local terminating: only the ready ones",
			sp:   itpLocal,
			eps: []model.Endpoint{
				catEP(1, "-ST", catOn(self)), catEP(2, "RS-", catOn(self)), catEP(3, "RS-", catOn(other)),
			},
			local:  []byte{2},
			hasAny: true,
		},
		{
			name:    "ITP Local on a node port (ETP Cluster): Cluster is computed too",
			sp:      itpLocalNodePort,
			eps:     []model.Endpoint{catEP(1, "RS-", catOn(self)), catEP(2, "RS-", catOn(other))},
			cluster: []byte{1, 2},
			local:   []byte{1},
			hasAny:  true,
		},

		// -- externalTrafficPolicy Local ------------------------------------------------------
		{
			name:    "ETP Local, local ready",
			sp:      etpLocal,
			eps:     []model.Endpoint{catEP(1, "RS-", catOn(self)), catEP(2, "RS-", catOn(other)), catEP(3, "-ST", catOn(self))},
			cluster: []byte{1, 2},
			local:   []byte{1},
			hasAny:  true,
		},
		{
			name: "ETP Local, local only terminating: Local falls back, Cluster keeps the ready remote ones",
			sp:   etpLocal,
			eps: []model.Endpoint{
				catEP(1, "RS-", catOn(other)), catEP(2, "---", catOn(self)), catEP(3, "-ST", catOn(self)), catEP(4, "-ST", catOn(other)),
			},
			cluster: []byte{1},
			local:   []byte{3},
			hasAny:  true,
		},
		{
			name:    "ETP Local, no local endpoint: HasAny, Local empty",
			sp:      etpLocal,
			eps:     []model.Endpoint{catEP(1, "RS-", catOn(other)), catEP(2, "RS-", catOn(third))},
			cluster: []byte{1, 2},
			hasAny:  true,
		},
		{
			name: "ETP Local, nothing ready: both fall back to serving+terminating",
			sp:   etpLocal,
			eps: []model.Endpoint{
				catEP(1, "-ST", catOn(other)), catEP(2, "-ST", catOn(self)), catEP(3, "--T", catOn(self)),
			},
			cluster: []byte{1, 2},
			local:   []byte{2},
			hasAny:  true,
		},
		{
			name:    "ETP Local on load-balancer IPs only (no node port)",
			sp:      etpLocalLB,
			eps:     []model.Endpoint{catEP(1, "RS-", catOn(other)), catEP(2, "RS-", catOn(self))},
			cluster: []byte{1, 2},
			local:   []byte{2},
			hasAny:  true,
		},
		{
			name:    "ETP Local on external IPs only",
			sp:      etpLocalExtIP,
			eps:     []model.Endpoint{catEP(1, "RS-", catOn(self)), catEP(2, "RS-", catOn(other))},
			cluster: []byte{1, 2},
			local:   []byte{1},
			hasAny:  true,
		},
		{
			name:    "ITP and ETP Local on a node port, all remote",
			sp:      bothLocal,
			eps:     []model.Endpoint{catEP(1, "RS-", catOn(other)), catEP(2, "RS-", catOn(third))},
			cluster: []byte{1, 2},
			hasAny:  true,
		},
		{
			name:    "ITP and ETP Local on a node port, all remote and terminating",
			sp:      bothLocal,
			eps:     []model.Endpoint{catEP(1, "-ST", catOn(other)), catEP(2, "-ST", catOn(third))},
			cluster: []byte{1, 2},
			hasAny:  true,
		},

		// -- topology hints -------------------------------------------------------------------
		{
			name: "zone hints on every endpoint, some for this zone: only those",
			sp:   clusterPolicy,
			eps: []model.Endpoint{
				catEP(1, "RS-", catZones("zone-a")), catEP(2, "RS-", catZones("zone-b")),
				catEP(3, "RS-", catZones("zone-c")), catEP(4, "RS-", catZones("zone-a")),
			},
			cluster: []byte{1, 4},
			hasAny:  true,
		},
		{
			name: "several zones in one hint: any endpoint naming this zone",
			sp:   clusterPolicy,
			node: &model.Node{Name: self, Zone: "zone-c"},
			eps: []model.Endpoint{
				catEP(1, "RS-", catZones("zone-a", "zone-b", "zone-c")), catEP(2, "RS-", catZones("zone-b", "zone-c")),
				catEP(3, "RS-", catZones("zone-b", "zone-d")), catEP(4, "RS-", catZones("zone-c")),
			},
			cluster: []byte{1, 2, 4},
			hasAny:  true,
		},
		{
			name: "one ready endpoint without hints: hints ignored, all ready",
			sp:   clusterPolicy,
			eps: []model.Endpoint{
				catEP(1, "RS-", catZones("zone-a")), catEP(2, "RS-", catZones("zone-b")),
				catEP(3, "RS-"), catEP(4, "RS-", catZones("zone-a")),
			},
			cluster: []byte{1, 2, 3, 4},
			hasAny:  true,
		},
		{
			name:    "hints name only other zones: all ready",
			sp:      clusterPolicy,
			eps:     []model.Endpoint{catEP(1, "RS-", catZones("zone-b")), catEP(2, "RS-", catZones("zone-c"))},
			cluster: []byte{1, 2},
			hasAny:  true,
		},
		{
			name:    "node without a zone label: all ready",
			sp:      clusterPolicy,
			node:    &model.Node{Name: self},
			eps:     []model.Endpoint{catEP(1, "RS-", catZones("zone-a")), catEP(2, "RS-", catZones("zone-b"))},
			cluster: []byte{1, 2},
			hasAny:  true,
		},
		{
			name: "node hints take precedence over zone hints",
			sp:   clusterPolicy,
			eps: []model.Endpoint{
				catEP(1, "RS-", catZones("zone-a"), catNodes(self)), catEP(2, "RS-", catZones("zone-b"), catNodes(other)),
				catEP(3, "RS-", catZones("zone-c"), catNodes(third)), catEP(4, "RS-", catZones("zone-a"), catNodes("node-d")),
			},
			cluster: []byte{1},
			hasAny:  true,
		},
		{
			name: "node hints present but none for this node: zone hints decide",
			sp:   clusterPolicy,
			eps: []model.Endpoint{
				catEP(1, "RS-", catZones("zone-a"), catNodes(other)), catEP(2, "RS-", catZones("zone-b"), catNodes(third)),
				catEP(3, "RS-", catZones("zone-a"), catNodes("node-d")),
			},
			cluster: []byte{1, 3},
			hasAny:  true,
		},
		{
			name: "node hints missing on one ready endpoint: zone hints decide",
			sp:   clusterPolicy,
			eps: []model.Endpoint{
				catEP(1, "RS-", catZones("zone-a"), catNodes(self)), catEP(2, "RS-", catZones("zone-a")),
				catEP(3, "RS-", catZones("zone-b"), catNodes(other)),
			},
			cluster: []byte{1, 2},
			hasAny:  true,
		},
		{
			name: "node hints for this node but no zone hints anywhere",
			sp:   clusterPolicy,
			node: &model.Node{Name: self},
			eps: []model.Endpoint{
				catEP(1, "RS-", catNodes(other)), catEP(2, "RS-", catNodes(self)), catEP(3, "RS-", catNodes(self, third)),
			},
			cluster: []byte{2, 3},
			hasAny:  true,
		},
		{
			name: "empty node name: node hints never match, zone hints decide",
			sp:   clusterPolicy,
			node: &model.Node{Zone: "zone-a"},
			eps: []model.Endpoint{
				catEP(1, "RS-", catZones("zone-a"), catNodes(other)), catEP(2, "RS-", catZones("zone-b"), catNodes(third)),
			},
			cluster: []byte{1},
			hasAny:  true,
		},
		{
			name: "a not-ready endpoint without hints does not disable topology, and is not used",
			sp:   clusterPolicy,
			eps: []model.Endpoint{
				catEP(1, "RS-", catZones("zone-a")), catEP(2, "RS-", catZones("zone-b")),
				catEP(3, "-ST"), catEP(4, "---", catZones("zone-a")),
			},
			cluster: []byte{1},
			hasAny:  true,
		},
		{
			name: "only not-ready endpoints are hinted for this zone: no filtering",
			sp:   clusterPolicy,
			eps: []model.Endpoint{
				catEP(1, "-ST", catZones("zone-a")), catEP(2, "RS-", catZones("zone-b")),
				catEP(3, "RS-", catZones("zone-c")), catEP(4, "---", catZones("zone-a")),
			},
			cluster: []byte{2, 3},
			hasAny:  true,
		},
		{
			name: "only not-ready endpoints are hinted for this node: zone hints decide",
			sp:   clusterPolicy,
			eps: []model.Endpoint{
				catEP(1, "-ST", catZones("zone-a"), catNodes(self)), catEP(2, "RS-", catZones("zone-b"), catNodes(other)),
				catEP(3, "RS-", catZones("zone-a"), catNodes(third)),
			},
			cluster: []byte{3},
			hasAny:  true,
		},
		{
			name: "terminating fallback ignores hints: none ready, terminating ones hinted elsewhere",
			sp:   clusterPolicy,
			eps: []model.Endpoint{
				catEP(1, "-ST", catZones("zone-b")), catEP(2, "-ST", catZones("zone-a")),
				catEP(3, "-ST", catZones("zone-c"), catNodes(third)), catEP(4, "--T", catZones("zone-a")),
			},
			cluster: []byte{1, 2, 3},
			hasAny:  true,
		},
		{
			name: "topology with ETP Local: Cluster follows hints, Local ignores them",
			sp:   etpLocal,
			eps: []model.Endpoint{
				catEP(1, "RS-", catOn(self), catZones("zone-a")), catEP(2, "RS-", catOn(self), catZones("zone-b")),
				catEP(3, "RS-", catOn(other), catZones("zone-a")), catEP(4, "RS-", catOn(other), catZones("zone-b")),
			},
			cluster: []byte{1, 3},
			local:   []byte{1, 2},
			hasAny:  true,
		},
		{
			name: "topology with ETP Local and only terminating local endpoints",
			sp:   etpLocal,
			eps: []model.Endpoint{
				catEP(1, "RS-", catOn(other), catZones("zone-a")), catEP(2, "RS-", catOn(third), catZones("zone-b")),
				catEP(3, "-ST", catOn(self), catZones("zone-b")), catEP(4, "-ST", catOn(self)),
			},
			cluster: []byte{1},
			local:   []byte{3, 4},
			hasAny:  true,
		},
		{
			name: "topology with ITP Local (internal only): Local ignores hints",
			sp:   itpLocal,
			eps: []model.Endpoint{
				catEP(1, "RS-", catOn(self), catZones("zone-b"), catNodes(other)), catEP(2, "RS-", catOn(other), catZones("zone-a"), catNodes(self)),
			},
			local:  []byte{1},
			hasAny: true,
		},

		// -- which endpoints are local -----------------------------------------------------
		{
			name:    "empty node name: nothing is local, not even endpoints without a node",
			sp:      etpLocal,
			node:    &model.Node{Zone: "zone-a"},
			eps:     []model.Endpoint{catEP(1, "RS-"), catEP(2, "RS-", catOn(other))},
			cluster: []byte{1, 2},
			hasAny:  true,
		},
		{
			name:   "endpoint without a node name is not local",
			sp:     itpLocal,
			eps:    []model.Endpoint{catEP(1, "RS-"), catEP(2, "-ST")},
			hasAny: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := here
			if tc.node != nil {
				n = *tc.node
			}
			before := dumpCatInput(tc.eps)
			sp := tc.sp
			got := model.Categorize(&sp, tc.eps, n)
			if g, w := catEPs(got.Cluster), catWant(tc.cluster); g != w {
				t.Errorf("Cluster = [%s], want [%s]", g, w)
			}
			if g, w := catEPs(got.Local), catWant(tc.local); g != w {
				t.Errorf("Local = [%s], want [%s]", g, w)
			}
			if got.HasAny != tc.hasAny {
				t.Errorf("HasAny = %v, want %v", got.HasAny, tc.hasAny)
			}
			if after := dumpCatInput(tc.eps); after != before {
				t.Errorf("Categorize changed its input:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
}

// dumpCatInput renders endpoints with everything Categorize reads, to detect changes.
func dumpCatInput(eps []model.Endpoint) string {
	var b strings.Builder
	for _, e := range eps {
		fmt.Fprintf(&b, "%s/%t%t%t@%s%%%s", e.AddrPort(), e.Ready, e.Serving, e.Terminating, e.NodeName, e.Zone)
		b.WriteString(" z=" + strings.Join(e.ZoneHints(), "+"))
		b.WriteString(" n=" + strings.Join(e.NodeHints(), "+"))
		b.WriteString(";")
	}
	return b.String()
}
