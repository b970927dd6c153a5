// Package testrules has the small inputs tests compile into rulesets (nft/... and cmd):
// one configuration and a service port maker. Only tests import it.
package testrules

import (
	"net/netip"
	"sort"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/nft"
)

// Config is an IPv4 compiler configuration: cluster CIDR 10.244.0.0/16, masquerade bit
// 14, node port address 192.0.2.10.
func Config() compile.Config {
	return compile.Config{
		Family:        nft.IPv4,
		DetectLocal:   compile.DetectLocal{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}},
		MasqueradeBit: 14,
		NodePortAddrs: []netip.Addr{netip.MustParseAddr("192.0.2.10")},
	}
}

// Service returns TCP service port default/name:http (port 80, node port nodePort, 0
// for none) with n ready endpoints numbered from first (10.244.x.y:8080).
func Service(name string, clusterIP string, nodePort uint16, first, n int) model.ServicePort {
	sp := model.ServicePort{
		Name:       model.ServicePortName{Namespace: "default", Name: name, Port: "http", Protocol: model.ProtoTCP},
		ClusterIPs: []netip.Addr{netip.MustParseAddr(clusterIP)},
		Port:       80,
		NodePort:   nodePort,
	}
	for i := first; i < first+n; i++ {
		sp.Endpoints = append(sp.Endpoints, model.Endpoint{
			Addr: netip.AddrFrom4([4]byte{10, 244, byte(i / 250), byte(1 + i%250)}), Port: 8080, Ready: true, Serving: true,
		})
	}
	return sp
}

// ListTable returns "nft list table ip nftproxy" with its top-level objects (sets and
// chains, which nft lists in creation order) sorted, so that equal contents compare equal.
func ListTable(t testing.TB, ns *testnetns.NS) string {
	t.Helper()
	out := ns.MustRun(t, "", "nft", "list", "table", "ip", "nftproxy")
	out = strings.TrimSpace(out)
	out = strings.TrimPrefix(out, "table ip nftproxy {")
	out = strings.TrimSuffix(out, "}")
	blocks := strings.Split(strings.TrimSpace(out), "\n\n")
	for i := range blocks {
		blocks[i] = strings.TrimSpace(blocks[i])
	}
	sort.Strings(blocks)
	return strings.Join(blocks, "\n\n")
}
