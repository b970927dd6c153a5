package compile

import (
	"fmt"
	"net/netip"

	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/nft"
)

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

func ep(addr string, port uint16) model.Endpoint {
	return model.Endpoint{Addr: ip(addr), Port: port, Ready: true, Serving: true}
}

// configFor returns the test configuration of a family.
func configFor(fam nft.Family) Config {
	if fam == nft.IPv6 {
		return Config{
			Family:        nft.IPv6,
			DetectLocal:   DetectLocal{Mode: LocalClusterCIDR, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("fd00:244::/56")}},
			MasqueradeBit: 14,
			NodePortAddrs: []netip.Addr{ip("2001:db8::10")},
		}
	}
	return testConfig()
}

func testConfig() Config {
	return Config{
		Family:        nft.IPv4,
		DetectLocal:   DetectLocal{Mode: LocalClusterCIDR, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}},
		MasqueradeBit: 14,
		NodePortAddrs: []netip.Addr{ip("192.0.2.10")},
	}
}

// scenarios are the golden inputs shared by the golden and kernel tests.
func scenarios() map[string]*model.Snapshot {
	node := model.Node{Name: "node-1", IPs: []netip.Addr{ip("192.0.2.10")}}
	return map[string]*model.Snapshot{
		"clusterip-2ep": {Node: node, Services: model.Ports([]model.ServicePort{{
			Name:       model.ServicePortName{Namespace: "default", Name: "echo", Port: "http", Protocol: model.ProtoTCP},
			ClusterIPs: []netip.Addr{ip("10.96.0.10")}, Port: 80,
			Endpoints: []model.Endpoint{ep("10.244.1.2", 8080), ep("10.244.1.3", 8080)},
		}})},
		"maglev": {Node: node, Services: model.Ports([]model.ServicePort{{
			Name:       model.ServicePortName{Namespace: "default", Name: "sip", Port: "sip", Protocol: model.ProtoUDP},
			ClusterIPs: []netip.Addr{ip("10.96.0.60")}, Port: 5060, Balancing: model.BalancingMaglev,
			Endpoints: []model.Endpoint{ep("10.244.1.2", 5060), ep("10.244.1.3", 5060), ep("10.244.2.4", 5060)},
		}})},
		"all-kinds": {Node: node, Services: model.Ports([]model.ServicePort{
			{
				Name:       model.ServicePortName{Namespace: "default", Name: "dns", Port: "dns", Protocol: model.ProtoUDP},
				ClusterIPs: []netip.Addr{ip("10.96.0.53")}, Port: 53,
				Endpoints: []model.Endpoint{ep("10.244.1.2", 5353)},
			},
			{
				Name:       model.ServicePortName{Namespace: "default", Name: "dns", Port: "dns-tcp", Protocol: model.ProtoTCP},
				ClusterIPs: []netip.Addr{ip("10.96.0.53")}, Port: 53,
				Endpoints: []model.Endpoint{ep("10.244.1.2", 5353), ep("10.244.1.3", 5353)},
			},
			{
				Name:       model.ServicePortName{Namespace: "web", Name: "lb", Protocol: model.ProtoTCP},
				ClusterIPs: []netip.Addr{ip("10.96.1.1")}, Port: 443, NodePort: 30443,
				ExternalIPs: []netip.Addr{ip("203.0.113.7")}, LoadBalancerIPs: []netip.Addr{ip("198.51.100.1")},
				Endpoints: []model.Endpoint{ep("10.244.1.4", 8443), ep("10.244.2.4", 8443), ep("10.244.3.4", 8443)},
			},
			{
				Name:       model.ServicePortName{Namespace: "web", Name: "empty", Protocol: model.ProtoTCP},
				ClusterIPs: []netip.Addr{ip("10.96.1.2")}, Port: 80, NodePort: 30080,
				ExternalIPs: []netip.Addr{ip("203.0.113.8")},
			},
			{
				Name:       model.ServicePortName{Namespace: "web", Name: "sctp", Protocol: model.ProtoSCTP},
				ClusterIPs: []netip.Addr{ip("10.96.1.3")}, Port: 3868,
				Endpoints: []model.Endpoint{ep("10.244.1.5", 3868)},
			},
		})},
		"empty":    {Node: node},
		"policies": policiesScenario(),
		"dual-stack": {Node: model.Node{Name: "node-1", IPs: []netip.Addr{ip("192.0.2.10"), ip("2001:db8::10")}}, Services: model.Ports([]model.ServicePort{{
			Name:       model.ServicePortName{Namespace: "default", Name: "web", Port: "http", Protocol: model.ProtoTCP},
			ClusterIPs: []netip.Addr{ip("10.96.0.20"), ip("fd00:96::20")}, Port: 80, NodePort: 30080,
			ExternalIPs: []netip.Addr{ip("2001:db8:1::7")},
			Endpoints:   []model.Endpoint{ep("10.244.1.2", 8080), ep("fd00:244:1::2", 8080), ep("fd00:244:1::3", 8080)},
		}, {
			Name:       model.ServicePortName{Namespace: "default", Name: "dns", Protocol: model.ProtoUDP},
			ClusterIPs: []netip.Addr{ip("fd00:96::53")}, Port: 53, NodePort: 30053,
		}})},
		// Two services claim the same external IP and node port: default/a keeps them,
		// default/b keeps only its cluster IP.
		"conflicts": {Node: node, Services: model.Ports([]model.ServicePort{{
			Name:       model.ServicePortName{Namespace: "default", Name: "a", Port: "http", Protocol: model.ProtoTCP},
			ClusterIPs: []netip.Addr{ip("10.96.2.1"), ip("fd00:96::2:1")}, Port: 80, NodePort: 30100,
			ExternalIPs: []netip.Addr{ip("203.0.113.9"), ip("2001:db8:1::9")},
			Endpoints:   []model.Endpoint{ep("10.244.2.1", 8080), ep("fd00:244:2::1", 8080)},
		}, {
			Name:       model.ServicePortName{Namespace: "default", Name: "b", Port: "http", Protocol: model.ProtoTCP},
			ClusterIPs: []netip.Addr{ip("10.96.2.2"), ip("fd00:96::2:2")}, Port: 80, NodePort: 30100,
			ExternalIPs: []netip.Addr{ip("203.0.113.9"), ip("2001:db8:1::9")},
			Endpoints:   []model.Endpoint{ep("10.244.2.2", 8080), ep("fd00:244:2::2", 8080)},
		}})},
		// graceful has no ready endpoint, so its serving terminating ones are used (not
		// the one that stopped serving); down has none serving and is rejected.
		"terminating": {Node: node, Services: model.Ports([]model.ServicePort{{
			Name:       model.ServicePortName{Namespace: "default", Name: "down", Protocol: model.ProtoTCP},
			ClusterIPs: []netip.Addr{ip("10.96.3.2"), ip("fd00:96::3:2")}, Port: 80,
			Endpoints: []model.Endpoint{
				conds(ep("10.244.3.3", 8080), false, false, true), conds(ep("fd00:244:3::3", 8080), false, false, true),
			},
		}, {
			Name:       model.ServicePortName{Namespace: "default", Name: "graceful", Protocol: model.ProtoTCP},
			ClusterIPs: []netip.Addr{ip("10.96.3.1"), ip("fd00:96::3:1")}, Port: 80,
			Endpoints: []model.Endpoint{
				conds(ep("10.244.3.1", 8080), false, true, true), conds(ep("10.244.3.2", 8080), false, false, true),
				conds(ep("fd00:244:3::1", 8080), false, true, true), conds(ep("fd00:244:3::2", 8080), false, false, true),
			},
		}})},
		// big has 17 endpoints: two slot blocks (0-31), so small starts at slot 32.
		"endpoint-slots": {Node: node, Services: model.Ports([]model.ServicePort{{
			Name:       model.ServicePortName{Namespace: "default", Name: "big", Protocol: model.ProtoTCP},
			ClusterIPs: []netip.Addr{ip("10.96.4.1"), ip("fd00:96::4:1")}, Port: 80,
			Endpoints: numbered(17),
		}, {
			Name:       model.ServicePortName{Namespace: "default", Name: "small", Protocol: model.ProtoTCP},
			ClusterIPs: []netip.Addr{ip("10.96.4.2"), ip("fd00:96::4:2")}, Port: 80,
			Endpoints: []model.Endpoint{ep("10.244.4.100", 8080), ep("fd00:244:4::100", 8080)},
		}})},
	}
}

func conds(e model.Endpoint, ready, serving, terminating bool) model.Endpoint {
	e.Ready, e.Serving, e.Terminating = ready, serving, terminating
	return e
}

// numbered returns n IPv4 and n IPv6 endpoints, 10.244.4.1… and fd00:244:4::1….
func numbered(n int) []model.Endpoint {
	var out []model.Endpoint
	for i := 1; i <= n; i++ {
		out = append(out, ep(fmt.Sprintf("10.244.4.%d", i), 8080), ep(fmt.Sprintf("fd00:244:4::%d", i), 8080))
	}
	return out
}

// policiesScenario exercises traffic policies, source ranges, affinity and service CIDRs
// in both families.
func policiesScenario() *model.Snapshot {
	node := model.Node{Name: "node-1", IPs: []netip.Addr{ip("192.0.2.10"), ip("2001:db8::10")}}
	local := func(addr string) model.Endpoint { e := ep(addr, 8080); e.NodeName = "node-1"; return e }
	remote := func(addr string) model.Endpoint { e := ep(addr, 8080); e.NodeName = "node-2"; return e }
	return &model.Snapshot{
		Node:         node,
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00:96::/112")},
		Services: model.Ports([]model.ServicePort{
			{
				Name:       model.ServicePortName{Namespace: "default", Name: "affinity", Protocol: model.ProtoTCP},
				ClusterIPs: []netip.Addr{ip("10.96.0.30"), ip("fd00:96::30")}, Port: 80, AffinityTimeout: 60,
				Endpoints: []model.Endpoint{ep("10.244.1.2", 8080), ep("10.244.1.3", 8080), ep("10.244.1.4", 8080), ep("fd00:244:1::2", 8080), ep("fd00:244:1::3", 8080)},
			},
			{
				Name:       model.ServicePortName{Namespace: "default", Name: "etp-local", Port: "http", Protocol: model.ProtoTCP},
				ClusterIPs: []netip.Addr{ip("10.96.0.31"), ip("fd00:96::31")}, Port: 80, NodePort: 30100,
				LoadBalancerIPs: []netip.Addr{ip("198.51.100.20"), ip("2001:db8:2::20")}, ExternalPolicyLocal: true, HealthCheckNodePort: 32000,
				SourceRanges: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("2001:db8::/32")},
				Endpoints:    []model.Endpoint{local("10.244.1.2"), remote("10.244.2.2"), local("fd00:244:1::2"), remote("fd00:244:2::2")},
			},
			{
				Name:       model.ServicePortName{Namespace: "default", Name: "etp-local-remote-only", Protocol: model.ProtoUDP},
				ClusterIPs: []netip.Addr{ip("10.96.0.32"), ip("fd00:96::32")}, Port: 53, NodePort: 30053, ExternalPolicyLocal: true,
				Endpoints: []model.Endpoint{remote("10.244.2.3"), remote("fd00:244:2::3")},
			},
			{
				Name:       model.ServicePortName{Namespace: "default", Name: "itp-local", Protocol: model.ProtoTCP},
				ClusterIPs: []netip.Addr{ip("10.96.0.33"), ip("fd00:96::33")}, Port: 80, InternalPolicyLocal: true,
				Endpoints: []model.Endpoint{remote("10.244.2.4"), remote("fd00:244:2::4")},
			},
		}),
	}
}
