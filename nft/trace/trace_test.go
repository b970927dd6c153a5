package trace

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/nft"
)

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

func ep(addr string, node string) model.Endpoint {
	return model.Endpoint{Addr: ip(addr), Port: 8080, Ready: true, Serving: true, NodeName: node}
}

func spn(ns, name string, proto uint8) model.ServicePortName {
	return model.ServicePortName{Namespace: ns, Name: name, Protocol: proto}
}

const nodeIP, nodeIP6 = "192.0.2.10", "2001:db8::10"

// snapshot has one service of each kind, in both families.
func snapshot() *model.Snapshot {
	return &model.Snapshot{
		Node:         model.Node{Name: "node-1", IPs: []netip.Addr{ip(nodeIP), ip(nodeIP6)}},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")},
		Services: model.Ports([]model.ServicePort{
			{Name: spn("default", "echo", model.ProtoTCP), ClusterIPs: []netip.Addr{ip("10.96.0.10"), ip("fd00:96::10")}, Port: 80,
				Endpoints: []model.Endpoint{ep("10.244.1.2", "node-2"), ep("10.244.1.3", "node-2"), ep("fd00:244:1::2", "node-2"), ep("fd00:244:1::3", "node-2")}},
			{Name: spn("web", "lb", model.ProtoTCP), ClusterIPs: []netip.Addr{ip("10.96.1.1")}, Port: 443, NodePort: 30443,
				ExternalIPs: []netip.Addr{ip("203.0.113.7")}, LoadBalancerIPs: []netip.Addr{ip("198.51.100.1")},
				Endpoints: []model.Endpoint{ep("10.244.1.4", "node-2")}},
			{Name: spn("web", "empty", model.ProtoTCP), ClusterIPs: []netip.Addr{ip("10.96.1.2")}, Port: 80, NodePort: 30080},
			{Name: spn("web", "local", model.ProtoTCP), ClusterIPs: []netip.Addr{ip("10.96.1.3")}, Port: 80, NodePort: 30100,
				LoadBalancerIPs: []netip.Addr{ip("198.51.100.3")}, ExternalPolicyLocal: true,
				SourceRanges: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")},
				Endpoints:    []model.Endpoint{ep("10.244.0.5", "node-1"), ep("10.244.1.5", "node-2")}},
			{Name: spn("web", "remote", model.ProtoUDP), ClusterIPs: []netip.Addr{ip("10.96.1.4")}, Port: 53, NodePort: 30053,
				ExternalPolicyLocal: true, Endpoints: []model.Endpoint{ep("10.244.1.6", "node-2")}},
			{Name: spn("web", "sticky", model.ProtoTCP), ClusterIPs: []netip.Addr{ip("10.96.1.5")}, Port: 80, AffinityTimeout: 60,
				Endpoints: []model.Endpoint{ep("10.244.1.7", "node-2"), ep("10.244.1.8", "node-2"), ep("10.244.1.9", "node-2")}},
			{Name: spn("kube-system", "hostnet", model.ProtoTCP), ClusterIPs: []netip.Addr{ip("10.96.1.6")}, Port: 443,
				Endpoints: []model.Endpoint{{Addr: ip(nodeIP), Port: 6443, Ready: true, NodeName: "node-1"}}},
		}),
	}
}

func ruleset(t *testing.T, fam nft.Family) *nft.Ruleset {
	t.Helper()
	cfg := compile.Config{Family: fam, DetectLocal: compile.DetectLocal{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}, MasqueradeBit: 14,
		NodePortAddrs: []netip.Addr{ip(nodeIP), ip(nodeIP6)}}
	if fam == nft.IPv6 {
		cfg.DetectLocal.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("fd00:244::/56")}
	}
	rs, problems := compile.Compile(snapshot(), cfg, compile.NewSlots())
	if len(problems) > 0 {
		t.Fatalf("problems: %v", problems)
	}
	return rs
}

func isNode(a netip.Addr) bool { return a == ip(nodeIP) || a == ip(nodeIP6) || a.IsLoopback() }

// packet parses "tcp 1.2.3.4 -> 5.6.7.8:80" arriving from the network.
func packet(s string) Packet {
	var proto, src, dst string
	if _, err := fmt.Sscanf(s, "%s %s -> %s", &proto, &src, &dst); err != nil {
		panic(err)
	}
	d := netip.MustParseAddrPort(dst)
	p := Packet{Family: nft.IPv4, Saddr: ip(src), Daddr: d.Addr(), Dport: d.Port(), Hook: nft.Prerouting,
		L4Proto: map[string]uint8{"tcp": 6, "udp": 17, "sctp": 132}[proto]}
	if p.Daddr.Is6() {
		p.Family = nft.IPv6
	}
	return p
}

// summary renders outcomes compactly: "0.5 accept 10.244.1.2:8080 masq".
func summary(res *Result) []string {
	var out []string
	for _, o := range res.Outcomes {
		s := fmt.Sprintf("%.4g %s", o.Probability, o.Verdict)
		if o.DNAT.IsValid() {
			s += " " + o.DNAT.String()
		}
		if o.Masquerade {
			s += " masq"
		}
		out = append(out, s)
	}
	return out
}

func TestTrace(t *testing.T) {
	local := Context{IsLocal: isNode}
	for _, tc := range []struct {
		name   string
		pkt    string
		output bool // locally generated
		want   []string
	}{
		{"clusterip from pod", "tcp 10.244.7.7 -> 10.96.0.10:80", false, []string{"0.5 accept 10.244.1.2:8080", "0.5 accept 10.244.1.3:8080"}},
		{"clusterip from off-cluster", "tcp 172.16.0.9 -> 10.96.0.10:80", false, []string{"0.5 accept 10.244.1.2:8080 masq", "0.5 accept 10.244.1.3:8080 masq"}},
		{"clusterip from the node", "tcp 192.0.2.10 -> 10.96.0.10:80", true, []string{"0.5 accept 10.244.1.2:8080 masq", "0.5 accept 10.244.1.3:8080 masq"}},
		{"hairpin", "tcp 10.244.1.2 -> 10.96.0.10:80", false, []string{"0.5 accept 10.244.1.2:8080 masq", "0.5 accept 10.244.1.3:8080"}},
		{"nodeport from external", "tcp 203.0.113.50 -> 192.0.2.10:30443", false, []string{"1 accept 10.244.1.4:8080 masq"}},
		{"nodeport from pod", "tcp 10.244.7.7 -> 192.0.2.10:30443", false, []string{"1 accept 10.244.1.4:8080 masq"}},
		{"external IP", "tcp 203.0.113.50 -> 203.0.113.7:443", false, []string{"1 accept 10.244.1.4:8080 masq"}},
		{"load-balancer IP", "tcp 203.0.113.50 -> 198.51.100.1:443", false, []string{"1 accept 10.244.1.4:8080 masq"}},
		{"no endpoints", "tcp 10.244.7.7 -> 10.96.1.2:80", false, []string{"1 reject"}},
		{"no endpoints nodeport", "tcp 203.0.113.50 -> 192.0.2.10:30080", false, []string{"1 reject"}},
		{"no endpoints from the node", "tcp 192.0.2.10 -> 10.96.1.2:80", true, []string{"1 reject"}},
		{"undefined port", "tcp 10.244.7.7 -> 10.96.0.10:81", false, []string{"1 reject"}},
		{"undefined protocol", "udp 10.244.7.7 -> 10.96.0.10:80", false, []string{"1 reject"}},
		{"unallocated service IP", "tcp 10.244.7.7 -> 10.96.9.9:80", false, []string{"1 drop"}},
		{"unknown address", "udp 10.244.7.7 -> 8.8.8.8:53", false, []string{"1 accept"}},
		{"node address, no node port", "tcp 203.0.113.50 -> 192.0.2.10:22", false, []string{"1 accept"}},
		{"local policy keeps the client", "tcp 203.0.113.50 -> 192.0.2.10:30100", false, []string{"1 accept 10.244.0.5:8080"}},
		{"local policy, pod short-circuits", "tcp 10.244.7.7 -> 192.0.2.10:30100", false, []string{"0.5 accept 10.244.0.5:8080", "0.5 accept 10.244.1.5:8080"}},
		{"local policy, node masqueraded", "tcp 192.0.2.10 -> 192.0.2.10:30100", true, []string{"0.5 accept 10.244.0.5:8080 masq", "0.5 accept 10.244.1.5:8080 masq"}},
		{"source range allowed", "tcp 203.0.113.50 -> 198.51.100.3:80", false, []string{"1 accept 10.244.0.5:8080"}},
		{"source range denied", "tcp 172.16.0.9 -> 198.51.100.3:80", false, []string{"1 drop"}},
		{"local policy, no local endpoint", "udp 203.0.113.50 -> 192.0.2.10:30053", false, []string{"1 drop"}},
		{"affinity, new client", "tcp 10.244.7.7 -> 10.96.1.5:80", false, []string{"0.3333 accept 10.244.1.7:8080", "0.3333 accept 10.244.1.8:8080", "0.3333 accept 10.244.1.9:8080"}},
		{"host-network endpoint", "tcp 10.244.7.7 -> 10.96.1.6:443", false, []string{"1 accept 192.0.2.10:6443"}},
		{"host-network endpoint from the node", "tcp 192.0.2.10 -> 10.96.1.6:443", true, []string{"1 accept 192.0.2.10:6443 masq"}},
		{"ipv6 clusterip from pod", "tcp fd00:244::7:7 -> [fd00:96::10]:80", false, []string{"0.5 accept [fd00:244:1::2]:8080", "0.5 accept [fd00:244:1::3]:8080"}},
		{"ipv6 clusterip off-cluster", "tcp 2001:db8:9::9 -> [fd00:96::10]:80", false, []string{"0.5 accept [fd00:244:1::2]:8080 masq", "0.5 accept [fd00:244:1::3]:8080 masq"}},
		{"ipv6 undefined port", "tcp fd00:244::7:7 -> [fd00:96::10]:81", false, []string{"1 reject"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pkt := packet(tc.pkt)
			if tc.output {
				pkt.Hook = nft.Output
			}
			res, err := Trace(ruleset(t, pkt.Family), pkt, local)
			if err != nil {
				t.Fatal(err)
			}
			got := summary(res)
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("outcomes:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
				for _, o := range res.Outcomes {
					t.Log(pathText(o))
				}
			}
			checkProbabilities(t, res)
			for _, o := range res.Outcomes {
				if len(o.Path) == 0 {
					t.Errorf("outcome %s without a path", o.Verdict)
				}
			}
		})
	}
}

func checkProbabilities(t *testing.T, res *Result) {
	t.Helper()
	sum := 0.0
	for _, o := range res.Outcomes {
		sum += o.Probability
	}
	if math.Abs(sum-1) > 1e-9 {
		t.Errorf("probabilities sum to %v", sum)
	}
}

func pathText(o Outcome) string {
	var b strings.Builder
	for _, s := range o.Path {
		fmt.Fprintf(&b, "\n  %s: %s", s.Chain, s.Text)
		for _, m := range s.Matched {
			fmt.Fprintf(&b, " [@%s %s]", m.Set.Name, m.Text)
		}
	}
	return b.String()
}

// TestTracePath checks that the path holds the rules that matched, in order, with their
// comments and the elements that decided. Other rules may come in between: the compiler
// gains rules that do not change this packet's fate (and the depth of the lb tree above
// the chains named here follows the largest endpoint count).
func TestTracePath(t *testing.T) {
	for _, tc := range []struct {
		name, pkt string
		want      []string
	}{
		{"flat", "tcp 172.16.0.9 -> 10.96.0.10:80", []string{
			"nat-prerouting: jump services",
			`services: ip daddr . meta l4proto . th dport @cluster-frontends goto cluster-frontend [@cluster-frontends 10.96.0.10 . tcp . 80 comment "default/echo"]`,
			"cluster-frontend: ip saddr != 10.244.0.0/16 jump mark-for-masquerade",
			"mark-for-masquerade: meta mark set meta mark | 0x00004000",
			"lb-0-3: ip daddr . meta l4proto . th dport @endpoint-count-bit1 goto lb-2-3 [@endpoint-count-bit1 10.96.0.10 . tcp . 80]",
			"lb-2-3: dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 2 map @endpoints [@endpoints 10.96.0.10 . tcp . 80 . 1 : 10.244.1.3 . 8080]",
			"filter-forward: ct state new jump service-endpoints-check",
			"nat-postrouting: jump masquerading",
			"masquerading: meta mark set meta mark ^ 0x00004000",
			"masquerading: masquerade fully-random",
		}},
		// a service port with a chain of its own (an external Local policy with a node
		// port) and endpoint slots
		{"chained", "tcp 172.16.0.9 -> 10.96.1.3:80", []string{
			"nat-prerouting: jump services",
			`services: ip daddr . meta l4proto . th dport vmap @service-ips [@service-ips 10.96.1.3 . tcp . 80 comment "web/local" : goto svc-web/local/tcp/-]`,
			"svc-web/local/tcp/-: ip daddr 10.96.1.3 ip saddr != 10.244.0.0/16 jump mark-for-masquerade",
			"mark-for-masquerade: meta mark set meta mark | 0x00004000",
			`svc-web/local/tcp/-: meta l4proto tcp dnat ip to numgen random mod 2 map @endpoints-0 comment "web/local" [@endpoints-0 1 : 10.244.1.5 . 8080]`,
			"filter-forward: ct state new jump service-endpoints-check",
			"nat-postrouting: jump masquerading",
			"masquerading: meta mark set meta mark ^ 0x00004000",
			"masquerading: masquerade fully-random",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := Trace(ruleset(t, nft.IPv4), packet(tc.pkt), Context{IsLocal: isNode})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Outcomes) != 2 {
				t.Fatalf("%d outcomes, want one per endpoint (2)", len(res.Outcomes))
			}
			want := tc.want
			got := strings.Split(strings.TrimPrefix(pathText(res.Outcomes[1]), "\n  "), "\n  ")
			rest := got
			for _, w := range want {
				i := slices.Index(rest, w)
				if i < 0 {
					t.Fatalf("path lacks, in this order:\n  %s\npath:\n  %s", w, strings.Join(got, "\n  "))
				}
				rest = rest[i+1:]
			}
			if last := got[len(got)-1]; last != want[len(want)-1] {
				t.Errorf("path ends with %s", last)
			}
		})
	}
}
