package shapes

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

// TestNewFlowCost estimates what a new connection costs in each shape's NAT chains:
// NFTPROXY_SHAPES_BENCH=1 (root; NFTPROXY_SHAPES_FLOW_SIZE, default 30000x10). A
// thread in the table's namespace sends one UDP datagram to each of k different service
// addresses (k new conntrack entries, each through nat output: dispatch, DNAT, then
// masquerade in postrouting) out of a veth whose peer drops them; locally generated
// packets run the hooks in the sender's sendmsg, so the thread's CPU time over the k
// sends is the per-flow work, socket and routing included. The same loop without any
// table is the baseline; the difference is the ruleset's share.
func TestNewFlowCost(t *testing.T) {
	if os.Getenv("NFTPROXY_SHAPES_BENCH") != "1" {
		t.Skip("set NFTPROXY_SHAPES_BENCH=1 (root) to measure the per-flow cost")
	}
	size := "30000x10"
	if s := os.Getenv("NFTPROXY_SHAPES_FLOW_SIZE"); s != "" {
		size = s
	}
	var n, e int
	if _, err := fmt.Sscanf(size, "%dx%d", &n, &e); err != nil {
		t.Fatalf("size %q: %v", size, err)
	}
	const reps = 7
	k := min(n, 10000)
	svcs := Services(n, e)
	var report strings.Builder
	var base float64
	for _, shape := range append([]string{"none", Current}, Shapes...) {
		ns := testnetns.New(t)
		for _, c := range [][]string{
			// A veth pair inside the namespace; packets to 10/8 go to a neighbor with a
			// fixed MAC that nothing owns, and the peer drops them as addressed to
			// another host (no ARP, no forwarding).
			{"ip", "link", "add", "d0", "type", "veth", "peer", "name", "d1"},
			{"ip", "link", "set", "d0", "up"},
			{"ip", "link", "set", "d1", "up"},
			{"ip", "addr", "add", "192.168.9.1/24", "dev", "d0"},
			{"ip", "neigh", "add", "192.168.9.2", "lladdr", "02:00:00:00:00:02", "dev", "d0", "nud", "permanent"},
			{"ip", "route", "add", "10.0.0.0/8", "via", "192.168.9.2", "dev", "d0"},
		} {
			ns.MustRun(t, "", c...)
		}
		switch shape {
		case "none":
		case Current:
			a := kernel.New(kernel.WithNetNS(ns.FD))
			cfg := compile.Config{Family: nft.IPv4, DetectLocal: compile.DetectLocal{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix(ClusterCIDR)}}, MasqueradeBit: 14,
				NodePortAddrs: []netip.Addr{netip.MustParseAddr("192.0.2.10")}}
			snap := &model.Snapshot{}
			for i, s := range svcs {
				sp := model.ServicePort{
					Name:       model.ServicePortName{Namespace: "default", Name: fmt.Sprintf("s%06d", i), Port: "http", Protocol: model.ProtoUDP},
					ClusterIPs: []netip.Addr{s.IP}, Port: s.Port,
				}
				for _, ep := range s.Endpoints {
					sp.Endpoints = append(sp.Endpoints, model.Endpoint{Addr: ep.Addr, Port: ep.Port, Ready: true, Serving: true})
				}
				snap.Services = append(snap.Services, &sp)
			}
			rs, _ := compile.NewCompiler(cfg, compile.NewSlots()).Compile(snap)
			if _, err := a.Apply(rs); err != nil {
				t.Fatal(err)
			}
		default:
			text := Generate(shape, svcs, classes1To(maxClass))
			ns.MustRun(t, strings.ReplaceAll(text, " . tcp . ", " . udp . "), "nft", "-f", "-")
		}
		var per []time.Duration
		for r := 0; r < reps; r++ {
			var cpu time.Duration
			err := inNS(ns.FD, func() error {
				c, err := net.ListenPacket("udp4", "192.168.9.1:0")
				if err != nil {
					return err
				}
				defer c.Close()
				start := ThreadCPU()
				for i := 0; i < k; i++ {
					s := svcs[(i*7919+r)%n]
					if _, err := c.WriteTo([]byte{0}, &net.UDPAddr{IP: s.IP.AsSlice(), Port: int(s.Port)}); err != nil {
						return fmt.Errorf("send %d: %w", i, err)
					}
				}
				cpu = ThreadCPU() - start
				return nil
			})
			if err != nil {
				t.Fatalf("%s: %v", shape, err)
			}
			per = append(per, cpu/time.Duration(k))
		}
		slices.Sort(per)
		med := float64(per[len(per)/2].Nanoseconds())
		if shape == "none" {
			base = med
		}
		fmt.Fprintf(&report, "| %s | %.0f ns | %.0f ns | %.0f–%.0f ns |\n", shape, med, med-base,
			float64(per[0].Nanoseconds()), float64(per[len(per)-1].Nanoseconds()))
	}
	t.Logf("%d services × %d endpoints, %d new flows per repetition, %d repetitions; CPU per flow:\n| shape | median | over no table | range |\n| --- | --- | --- | --- |\n%s",
		n, e, k, reps, report.String())
}
