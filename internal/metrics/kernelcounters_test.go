package metrics

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

// KernelCounters against a real kernel: two ports of a Service whose namespace and
// name fill the 128-byte element comment come back as two service ports, with their
// node ports' counters attributed too.
func TestKernelCounters(t *testing.T) {
	ns := testnetns.New(t)
	long := func(c string) string { return strings.Repeat(c, 63) }
	sp := func(name string, number, nodePort uint16) model.ServicePort {
		return model.ServicePort{
			Name:       port(long("n"), long("s"), name, model.ProtoTCP),
			ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1")},
			Port:       number, NodePort: nodePort,
			Endpoints: []model.Endpoint{{Addr: netip.MustParseAddr("10.244.1.2"), Port: 8080, Ready: true, Serving: true}},
		}
	}
	cfg := compile.Config{Family: nft.IPv4, MasqueradeBit: 14, NodePortAddrs: []netip.Addr{netip.MustParseAddr("192.0.2.10")}}
	rs, _ := compile.NewCompiler(cfg, compile.NewSlots()).Compile(&model.Snapshot{Services: model.Ports([]model.ServicePort{sp("web-one", 80, 30080), sp("web-two", 81, 0)})})
	a := kernel.New(kernel.WithNetNS(ns.FD))
	if _, err := a.Apply(rs); err != nil {
		t.Fatal(err)
	}
	ports, rejects, err := KernelCounters(a, []nft.Family{nft.IPv4})()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range ports {
		names = append(names, p.Port.Port)
		if p.Port.Namespace != long("n") || p.Port.Name != long("s") || p.Port.Protocol != model.ProtoTCP {
			t.Errorf("service port %+v", p.Port)
		}
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"web-one", "web-two"}) || rejects != 0 {
		t.Fatalf("ports %v (%+v), rejects %d; want web-one, web-two", names, ports, rejects)
	}
}

// AppliedParts names the service port of a part by its tag, in the family it was
// applied in, and follows each snapshot of the Applier's.
func TestAppliedParts(t *testing.T) {
	cfg := compile.Config{Family: nft.IPv4, MasqueradeBit: 14}
	web := port("default", "web", "http", model.ProtoTCP)
	dns := port("kube-system", "dns", "", model.ProtoUDP)
	svc := func(name model.ServicePortName, ip string) model.ServicePort {
		return model.ServicePort{Name: name, ClusterIPs: []netip.Addr{netip.MustParseAddr(ip)}, Port: 80}
	}
	cc := compile.NewCompiler(cfg, compile.NewSlots())
	rs, _ := cc.Compile(&model.Snapshot{Services: model.Ports([]model.ServicePort{svc(web, "10.96.0.1")})})
	var applied *kernel.Applied
	ap := PartsOf(func() *kernel.Applied { return applied })
	if _, ok := ap.ServicePort(nft.IPv4, compile.ChainName("port", web)); ok {
		t.Fatal("a part found before anything was applied")
	}
	applied = kernel.AppliedOf(rs)
	if got, ok := ap.ServicePort(nft.IPv4, compile.ChainName("port", web)); !ok || got != web {
		t.Errorf("web: %v, %v", got, ok)
	}
	if _, ok := ap.ServicePort(nft.IPv6, compile.ChainName("port", web)); ok {
		t.Error("web found in IPv6")
	}
	if _, ok := ap.ServicePort(nft.IPv4, "port-default/web/tcp/http/x"); ok {
		t.Error("an unknown owner found")
	}
	rs, _ = cc.Compile(&model.Snapshot{Services: model.Ports([]model.ServicePort{svc(dns, "10.96.0.10")})})
	applied = kernel.AppliedOf(rs)
	if got, ok := ap.ServicePort(nft.IPv4, compile.ChainName("port", dns)); !ok || got != dns {
		t.Errorf("dns: %v, %v", got, ok)
	}
	if _, ok := ap.ServicePort(nft.IPv4, compile.ChainName("port", web)); ok {
		t.Error("web still found after it was removed")
	}
	var none *AppliedParts
	if _, ok := none.ServicePort(nft.IPv4, compile.ChainName("port", dns)); ok {
		t.Error("nil AppliedParts found a part")
	}
}
