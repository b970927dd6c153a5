package kernel_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

// TestCountersByOwner sends UDP packets to two ports of one Service whose namespace
// and name fill the kernel's 128-byte comment (so both elements carry the comment
// "<ns>/<name>:") and reads the counters back: each port gets its own packets, by
// element key.
func TestCountersByOwner(t *testing.T) {
	ns := testnetns.New(t)
	long := func(c string) string { return strings.Repeat(c, 63) }
	sp := func(port string, number uint16, ep byte) model.ServicePort {
		return model.ServicePort{
			Name:       model.ServicePortName{Namespace: long("n"), Name: long("s"), Port: port, Protocol: model.ProtoUDP},
			ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1")},
			Port:       number,
			Endpoints:  []model.Endpoint{{Addr: netip.AddrFrom4([4]byte{10, 244, 1, ep}), Port: 8080, Ready: true, Serving: true}},
		}
	}
	one, two := sp("metrics-port-one", 80, 2), sp("metrics-port-two", 81, 3)
	// as the controller compiles: one part per service port (compile.Compile flattens)
	rs, _ := compile.NewCompiler(cfg(), compile.NewSlots()).Compile(&model.Snapshot{Services: model.Ports([]model.ServicePort{one, two})})
	a := kernel.New(kernel.WithNetNS(ns.FD))
	if _, err := a.Apply(rs); err != nil {
		t.Fatal(err)
	}
	if set := ns.MustRun(t, "", "nft", "list", "set", "ip", "nftproxy", compile.SetServiceCounters); strings.Count(set, `comment "`+long("n")+"/"+long("s")+`:"`) != 2 {
		t.Fatalf("want both elements with the same cut comment:\n%s", set)
	}
	ns.MustRun(t, "", "ip", "link", "set", "lo", "up")
	// a route to the cluster IP: a veth pair inside the namespace
	ns.MustRun(t, "", "ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1")
	ns.MustRun(t, "", "ip", "link", "set", "v0", "up")
	ns.MustRun(t, "", "ip", "link", "set", "v1", "up")
	ns.MustRun(t, "", "ip", "addr", "add", "10.96.0.100/16", "dev", "v0")
	ns.MustRun(t, "", "ip", "addr", "add", "10.244.0.100/16", "dev", "v0") // and to the endpoints, after DNAT
	ns.MustRun(t, "", "bash", "-c", "echo x >/dev/udp/10.96.0.1/80; for i in 1 2 3; do echo x >/dev/udp/10.96.0.1/81; done")

	counts, unattributed, err := a.CountersByOwner(cfg().Family, compile.TableName, compile.SetServiceCounters, compile.SetNodePortCounters)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for _, c := range counts {
		got[c.Owner] = c.Packets
		if c.Bytes < c.Packets*29 { // 20 bytes IP, 8 UDP, 2 payload
			t.Errorf("%s: %d packets but %d bytes", c.Owner, c.Packets, c.Bytes)
		}
	}
	ownerOne, ownerTwo := compile.ChainName("port", one.Name), compile.ChainName("port", two.Name)
	if len(got) != 2 || got[ownerOne] != 1 || got[ownerTwo] != 3 || unattributed != 0 {
		t.Fatalf("counts %v (%d unattributed), want %s: 1, %s: 3", got, unattributed, ownerOne, ownerTwo)
	}
}
