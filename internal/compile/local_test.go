package compile

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/nft"
)

// localScenario is a golden scenario of one --detect-local-mode.
type localScenario struct {
	snap   *model.Snapshot
	detect DetectLocal
}

// localModeScenarios are the golden inputs of the local-traffic modes: the same
// services (a cluster IP, and a Local-policy node port with a load-balancer IP, where
// the check is used) under each mode.
func localModeScenarios() map[string]localScenario {
	snap := func() *model.Snapshot {
		node := model.Node{Name: "node-1", IPs: []netip.Addr{ip("192.0.2.10"), ip("2001:db8::10")},
			PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:244:1::/64")}}
		local := ep("10.244.1.2", 8080)
		local.NodeName = "node-1"
		local6 := ep("fd00:244:1::2", 8080)
		local6.NodeName = "node-1"
		return &model.Snapshot{Node: node, Services: model.Ports([]model.ServicePort{
			{
				Name:       model.ServicePortName{Namespace: "default", Name: "echo", Protocol: model.ProtoTCP},
				ClusterIPs: []netip.Addr{ip("10.96.0.10"), ip("fd00:96::10")}, Port: 80,
				Endpoints: []model.Endpoint{ep("10.244.2.2", 8080), ep("fd00:244:2::2", 8080)},
			},
			{
				Name:       model.ServicePortName{Namespace: "default", Name: "etp-local", Protocol: model.ProtoTCP},
				ClusterIPs: []netip.Addr{ip("10.96.0.11"), ip("fd00:96::11")}, Port: 80, NodePort: 30080,
				LoadBalancerIPs: []netip.Addr{ip("198.51.100.20"), ip("2001:db8:2::20")}, ExternalPolicyLocal: true,
				Endpoints: []model.Endpoint{local, local6},
			},
		})}
	}
	return map[string]localScenario{
		"detect-local-clustercidr": {snap(), DetectLocal{Mode: LocalClusterCIDR,
			ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/56")}}},
		"detect-local-nodecidr": {snap(), DetectLocal{Mode: LocalNodeCIDR}},
		"detect-local-bridge":   {snap(), DetectLocal{Mode: LocalBridgeInterface, Interface: "cbr0"}},
		"detect-local-prefix":   {snap(), DetectLocal{Mode: LocalInterfaceNamePrefix, Interface: "veth"}},
	}
}

// localConfig is configFor(fam) with the scenario's mode.
func (s localScenario) config(fam nft.Family) Config {
	cfg := configFor(fam)
	cfg.DetectLocal = s.detect
	return cfg
}

// Each mode puts its own match, and only it, where kube-proxy's nftables mode puts the
// local check: "not local" before masquerading cluster-IP traffic, "local" to
// short-circuit pod traffic to a Local-policy external address.
func TestLocalModeMatches(t *testing.T) {
	for _, tc := range []struct {
		name          string
		fam           nft.Family
		local, remote string
	}{
		{"detect-local-clustercidr", nft.IPv4, "ip saddr 10.244.0.0/16", "ip saddr != 10.244.0.0/16"},
		{"detect-local-clustercidr", nft.IPv6, "ip6 saddr fd00:244::/56", "ip6 saddr != fd00:244::/56"},
		{"detect-local-nodecidr", nft.IPv4, "ip saddr 10.244.1.0/24", "ip saddr != 10.244.1.0/24"},
		{"detect-local-nodecidr", nft.IPv6, "ip6 saddr fd00:244:1::/64", "ip6 saddr != fd00:244:1::/64"},
		{"detect-local-bridge", nft.IPv4, `iifname "cbr0"`, `iifname != "cbr0"`},
		{"detect-local-prefix", nft.IPv6, `iifname "veth*"`, `iifname != "veth*"`},
	} {
		sc := localModeScenarios()[tc.name]
		rs, _ := Compile(sc.snap, sc.config(tc.fam), NewSlots())
		text := nft.Render(rs)
		if !strings.Contains(text, tc.local+` goto svc-default/etp-local/tcp/- comment "short-circuit pod traffic"`) {
			t.Errorf("%s/%s: no short-circuit on %q:\n%s", tc.name, tc.fam, tc.local, text)
		}
		if !strings.Contains(text, tc.remote+" jump mark-for-masquerade") {
			t.Errorf("%s/%s: no masquerade of %q:\n%s", tc.name, tc.fam, tc.remote, text)
		}
		if n := strings.Count(text, "short-circuit pod traffic"); n != 1 {
			t.Errorf("%s/%s: %d short-circuit rules, want 1", tc.name, tc.fam, n)
		}
	}
}

// NodeCIDR without a pod CIDR of the family (the Node has none yet, or is single-stack):
// no local check in that family, as kube-proxy's no-op detector; and the check follows
// the Node's pod CIDRs when they change, on an incremental Compiler too.
func TestNodeCIDRFollowsTheNode(t *testing.T) {
	sc := localModeScenarios()["detect-local-nodecidr"]
	c := NewCompiler(sc.config(nft.IPv4), NewSlots())
	rs, _ := c.Compile(sc.snap)
	if text := nft.Render(rs); !strings.Contains(text, "ip saddr != 10.244.1.0/24") {
		t.Fatalf("no pod CIDR check:\n%s", text)
	}
	changed := *sc.snap
	changed.Node.PodCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.7.0/24")}
	rs, _ = c.Compile(&changed)
	if text := nft.Render(rs); !strings.Contains(text, "ip saddr != 10.244.7.0/24") || strings.Contains(text, "10.244.1.0/24") {
		t.Errorf("after the pod CIDR changed:\n%s", text)
	}
	changed.Node.PodCIDRs = nil
	rs, _ = c.Compile(&changed)
	if text := nft.Render(rs); strings.Contains(text, "saddr != 10.244") || strings.Contains(text, "short-circuit pod traffic") {
		t.Errorf("without a pod CIDR, a local check remains:\n%s", text)
	}
}
