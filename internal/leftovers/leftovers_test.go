package leftovers

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/nft"
)

type fakeTables map[nft.Family]map[string][]string

func (f fakeTables) Tables(fam nft.Family) (map[string][]string, error) {
	if f == nil {
		return nil, errors.New("no netlink")
	}
	return f[fam], nil
}

func TestFind(t *testing.T) {
	tables := fakeTables{
		nft.IPv4: {
			"nftproxy":   {"services", "nodeports"},
			"kube-proxy": {"services", "service-ABC-default/web/tcp/http"},
			"nat":        {"PREROUTING", "KUBE-SERVICES", "KUBE-SVC-ABCDEF", "KUBE-SEP-123", "KUBE-KUBELET-CANARY", "KUBE-POSTROUTING"},
			"filter":     {"INPUT", "KUBE-FIREWALL", "KUBE-KUBELET-CANARY"}, // the kubelet's only
		},
		nft.IPv6: {"mangle": {"KUBE-IPTABLES-HINT", "KUBE-PROXY-CANARY"}},
	}
	got, err := Find(tables)
	if err != nil {
		t.Fatal(err)
	}
	want := []Leftover{
		{Family: nft.IPv4, Table: "kube-proxy", Mode: "nftables", Chains: []string{"services", "service-ABC-default/web/tcp/http"}},
		{Family: nft.IPv4, Table: "nat", Mode: "iptables", Chains: []string{"KUBE-SERVICES", "KUBE-SVC-ABCDEF", "KUBE-SEP-123"}},
		{Family: nft.IPv6, Table: "mangle", Mode: "iptables", Chains: []string{"KUBE-PROXY-CANARY"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("found\n%+v\nwant\n%+v", got, want)
	}
	if none, _ := Find(fakeTables{nft.IPv4: {"filter": {"KUBE-FIREWALL"}, "nftproxy": {"services"}}}); len(none) != 0 {
		t.Errorf("the kubelet's and nftproxy's own chains taken for leftovers: %+v", none)
	}
}

func TestWarn(t *testing.T) {
	logs := &logLines{}
	Warn(logs.logger(), fakeTables{nft.IPv4: {"kube-proxy": {"a", "b", "c", "d", "e", "f"}}, nft.IPv6: {"kube-proxy": {"a"}}})
	line := logs.first("kube-proxy's rules are still in the kernel")
	for _, want := range []string{"table ip kube-proxy (6 chains: a, b, c, d and 2 more)", "table ip6 kube-proxy", "kube-proxy --cleanup", "nft delete table ip kube-proxy; nft delete table ip6 kube-proxy"} {
		if !strings.Contains(line, want) {
			t.Errorf("warning lacks %q: %s", want, line)
		}
	}
	logs = &logLines{}
	Warn(logs.logger(), fakeTables{nft.IPv4: {"nat": {"KUBE-SERVICES"}}})
	if line := logs.first("still in the kernel"); !strings.Contains(line, "kube-proxy --cleanup") || strings.Contains(line, "nft delete") {
		t.Errorf("iptables-mode leftovers: %s", line)
	}
	logs = &logLines{}
	Warn(logs.logger(), fakeTables{nft.IPv4: {"nftproxy": {"services"}}})
	if logs.count("") != 0 {
		t.Errorf("logged without leftovers: %s", logs)
	}
}
