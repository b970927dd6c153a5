package ctclean

import (
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/testnetns"
)

var node = model.Node{Name: "node-1"}

func ep(addr string, ready bool) model.Endpoint {
	return model.Endpoint{Addr: netip.MustParseAddr(addr), Port: 5353, Ready: ready, Serving: ready, NodeName: "node-2"}
}

func dns(proto uint8, eps ...model.Endpoint) model.ServicePort {
	return model.ServicePort{
		Name:       model.ServicePortName{Namespace: "kube-system", Name: "dns", Port: "dns", Protocol: proto},
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")}, Port: 53, Endpoints: eps,
	}
}

func snap(sps ...model.ServicePort) *model.Snapshot {
	return &model.Snapshot{Node: node, Services: sps}
}

func flows(fs []Flow) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.String()
	}
	sort.Strings(out)
	return out
}

func TestStale(t *testing.T) {
	a, b, c := ep("10.244.1.2", true), ep("10.244.1.3", true), ep("10.244.1.4", true)
	np := func(sp model.ServicePort) model.ServicePort { sp.NodePort = 30053; return sp }
	ext := func(sp model.ServicePort) model.ServicePort {
		sp.ExternalIPs = []netip.Addr{netip.MustParseAddr("203.0.113.5")}
		return sp
	}
	tests := []struct {
		name      string
		prev, cur *model.Snapshot
		want      []string
	}{
		{"first sync: nothing", nil, snap(dns(model.ProtoUDP, a)), nil},
		{"unchanged", snap(dns(model.ProtoUDP, a, b)), snap(dns(model.ProtoUDP, a, b)), nil},
		{"endpoint added: nothing stale", snap(dns(model.ProtoUDP, a)), snap(dns(model.ProtoUDP, a, b)), nil},
		{"endpoint removed", snap(dns(model.ProtoUDP, a, b)), snap(dns(model.ProtoUDP, a)), []string{"udp to 10.96.0.10:53 via 10.244.1.3"}},
		{"endpoint became not ready", snap(dns(model.ProtoUDP, a, b)), snap(dns(model.ProtoUDP, a, ep("10.244.1.3", false))), []string{"udp to 10.96.0.10:53 via 10.244.1.3"}},
		{"endpoint replaced", snap(dns(model.ProtoUDP, a)), snap(dns(model.ProtoUDP, c)), []string{"udp to 10.96.0.10:53 via 10.244.1.2"}},
		{"service deleted", snap(dns(model.ProtoUDP, a, b)), snap(), []string{"udp to 10.96.0.10:53 via 10.244.1.2", "udp to 10.96.0.10:53 via 10.244.1.3"}},
		{"TCP is left alone", snap(dns(model.ProtoTCP, a, b)), snap(dns(model.ProtoTCP)), nil},
		{"first endpoint appears", snap(dns(model.ProtoUDP)), snap(dns(model.ProtoUDP, a)), []string{"udp to 10.96.0.10:53"}},
		{"first endpoint of a new service: nothing was cached", snap(), snap(dns(model.ProtoUDP, a)), []string{"udp to 10.96.0.10:53"}},
		{"node port and external IP: every frontend", snap(ext(np(dns(model.ProtoUDP, a, b)))), snap(ext(np(dns(model.ProtoUDP, a)))),
			[]string{"udp to *:30053 via 10.244.1.3", "udp to 10.96.0.10:53 via 10.244.1.3", "udp to 203.0.113.5:53 via 10.244.1.3"}},
		{"node port gets its first endpoint", snap(np(dns(model.ProtoUDP))), snap(np(dns(model.ProtoUDP, a))), []string{"udp to *:30053", "udp to 10.96.0.10:53"}},
		{"only terminating left: still usable, nothing stale", snap(dns(model.ProtoUDP, a)),
			snap(dns(model.ProtoUDP, model.Endpoint{Addr: netip.MustParseAddr("10.244.1.2"), Port: 5353, Serving: true, Terminating: true})), nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := flows(Stale(tc.prev, tc.cur, Categorized))
			want := append([]string(nil), tc.want...)
			sort.Strings(want)
			if !slices.Equal(got, want) {
				t.Errorf("Stale:\n got %q\nwant %q", got, want)
			}
		})
	}
}

func TestFilterMatches(t *testing.T) {
	flow := func(dst string, dport uint16, replySrc string) *netlink.ConntrackFlow {
		f := &netlink.ConntrackFlow{FamilyType: 2}
		f.Forward.Protocol, f.Forward.DstIP, f.Forward.DstPort = 17, netip.MustParseAddr(dst).AsSlice(), dport
		f.Forward.SrcIP = netip.MustParseAddr("10.244.1.9").AsSlice()
		f.Reverse.Protocol, f.Reverse.SrcIP = 17, netip.MustParseAddr(replySrc).AsSlice()
		f.Reverse.DstIP = f.Forward.SrcIP
		return f
	}
	filter, err := Filter(Flow{Dst: netip.MustParseAddr("10.96.0.10"), DstPort: 53, Endpoint: netip.MustParseAddr("10.244.1.3")})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		f    *netlink.ConntrackFlow
		want bool
	}{
		{flow("10.96.0.10", 53, "10.244.1.3"), true},
		{flow("10.96.0.10", 53, "10.244.1.2"), false}, // another endpoint
		{flow("10.96.0.11", 53, "10.244.1.3"), false}, // another service
		{flow("10.96.0.10", 54, "10.244.1.3"), false}, // another port
	} {
		if got := filter.MatchConntrackFlow(tc.f); got != tc.want {
			t.Errorf("match %v -> %v = %v, want %v", tc.f.Forward, tc.f.Reverse, got, tc.want)
		}
	}
}

// TestCleanKernel creates UDP (and one TCP) conntrack entries in a throwaway namespace
// and checks that exactly the selected ones are deleted.
func TestCleanKernel(t *testing.T) {
	ns := testnetns.New(t)
	add := func(proto, src, dst string, dport int, replySrc string, sport int) {
		args := []string{"conntrack", "-I", "-p", proto, "-s", src, "-d", dst, "--sport", fmt.Sprint(sport), "--dport", fmt.Sprint(dport),
			"--reply-src", replySrc, "--reply-dst", src, "--reply-port-src", "5353", "--reply-port-dst", fmt.Sprint(sport), "-t", "120"}
		if proto == "tcp" {
			args = append(args, "--state", "ESTABLISHED")
		}
		ns.MustRun(t, "", args...)
	}
	add("udp", "10.244.1.9", "10.96.0.10", 53, "10.244.1.2", 40000)    // stale endpoint: delete
	add("udp", "10.244.1.9", "10.96.0.10", 53, "10.244.1.3", 40001)    // kept endpoint
	add("udp", "10.244.1.9", "10.96.0.11", 53, "10.244.1.2", 40002)    // another service
	add("tcp", "10.244.1.9", "10.96.0.10", 53, "10.244.1.2", 40003)    // TCP is never touched
	add("udp", "10.244.1.9", "192.0.2.10", 30053, "10.244.1.2", 40004) // node port via stale endpoint: delete

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	h, err := netlink.NewHandleAt(netns.NsHandle(ns.FD))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	stale := netip.MustParseAddr("10.244.1.2")
	n, err := Clean(h, []Flow{
		{Dst: netip.MustParseAddr("10.96.0.10"), DstPort: 53, Endpoint: stale},
		{DstPort: 30053, Endpoint: stale},
	})
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("deleted %d entries, want 2", n)
	}
	out := ns.MustRun(t, "", "conntrack", "-L")
	for _, want := range []string{"sport=40001", "sport=40002", "sport=40003"} {
		if !strings.Contains(out, want) {
			t.Errorf("entry %s was deleted:\n%s", want, out)
		}
	}
	for _, gone := range []string{"sport=40000", "sport=40004"} {
		if strings.Contains(out, gone) {
			t.Errorf("entry %s survived:\n%s", gone, out)
		}
	}
}
