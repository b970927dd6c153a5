package leftovers

import (
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

// In a throwaway namespace holding what kube-proxy leaves behind (its nftables-mode
// table, and iptables-nft's nat table with its chains next to the kubelet's), the real
// kernel read finds exactly kube-proxy's, and the warning names them.
func TestKubeProxyLeftoversInKernel(t *testing.T) {
	ns := testnetns.New(t)
	a := kernel.New(kernel.WithNetNS(ns.FD))
	if found, err := Find(a); err != nil || len(found) != 0 {
		t.Fatalf("empty namespace: %+v, %v", found, err)
	}
	ns.MustRun(t, `
table ip kube-proxy {
	chain nat-prerouting { type nat hook prerouting priority dstnat; policy accept; }
	chain services { }
}
table ip6 kube-proxy {
	chain services { }
}
table ip nat {
	chain PREROUTING { type nat hook prerouting priority dstnat; policy accept; jump KUBE-SERVICES; }
	chain KUBE-SERVICES { }
	chain KUBE-SVC-ERIFXISQEP7F7OF4 { }
	chain KUBE-KUBELET-CANARY { }
}
table ip filter {
	chain KUBE-FIREWALL { }
}
`, "nft", "-f", "-")
	found, err := Find(a)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range found {
		got = append(got, l.String())
	}
	want := []string{
		"nftables mode: table ip kube-proxy (2 chains: nat-prerouting, services)",
		"iptables mode: table ip nat (2 chains: KUBE-SERVICES, KUBE-SVC-ERIFXISQEP7F7OF4)",
		"nftables mode: table ip6 kube-proxy (1 chain: services)",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("found:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	logs := &logLines{}
	Warn(logs.logger(), a)
	if line := logs.first("still in the kernel"); !strings.Contains(line, "table ip nat") || !strings.Contains(line, "kube-proxy --cleanup") {
		t.Errorf("warning: %s", line)
	}
}
