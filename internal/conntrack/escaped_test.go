package conntrack

import (
	"slices"
	"testing"

	"github.com/nftproxy/nftproxy/internal/model"
)

// escapedTo selects the un-DNATed entries of protocol proto to cluster IP ip:port.
func escapedTo(proto uint8, ip string, port uint16) Flow {
	f := notNATed(ip, port)
	f.Protocol = proto
	return f
}

func TestEscaped(t *testing.T) {
	a := ready("10.244.1.2", 5353)
	port := func(name string, proto uint8, port uint16, edit func(*model.ServicePort)) model.ServicePort {
		sp := dns(a)
		sp.Name.Name, sp.Name.Protocol, sp.Port = name, proto, port
		if edit != nil {
			edit(&sp)
		}
		return sp
	}
	cur := snap(
		// every frontend kind: only the cluster IPs count, in both families
		port("web", model.ProtoTCP, 443, func(sp *model.ServicePort) {
			sp.ClusterIPs = addrs("10.96.0.10", "fd00:96::10")
			sp.NodePort = 30443
			sp.ExternalIPs = addrs("192.0.2.10")
			sp.LoadBalancerIPs = addrs("198.51.100.10")
		}),
		// same cluster IP, other protocols and ports; no endpoints does not matter
		port("web", model.ProtoUDP, 443, func(sp *model.ServicePort) { sp.ClusterIPs = addrs("10.96.0.10") }),
		port("sig", model.ProtoSCTP, 3868, func(sp *model.ServicePort) { sp.ClusterIPs = addrs("10.96.0.20"); sp.Endpoints = nil }),
		// headless: no cluster IP
		port("headless", model.ProtoTCP, 80, func(sp *model.ServicePort) { sp.ClusterIPs = nil }),
	)
	want := []Flow{
		escapedTo(model.ProtoTCP, "10.96.0.10", 443),
		escapedTo(model.ProtoUDP, "10.96.0.10", 443),
		escapedTo(model.ProtoSCTP, "10.96.0.20", 3868),
		escapedTo(model.ProtoTCP, "fd00:96::10", 443),
	}
	if got := Escaped(cur); !slices.Equal(got, want) {
		t.Errorf("Escaped:\ngot  %s\nwant %s", show(got), show(want))
	}
	if got := Escaped(nil); got != nil {
		t.Errorf("Escaped(nil) = %s, want nothing", show(got))
	}

	// What the flows select, through the cleaner's filters.
	d := &fakeDeleter{}
	if _, err := (&Cleaner{Deleter: d}).Clean(Escaped(cur)); err != nil || len(d.calls) != 2 {
		t.Fatalf("Clean: %v in %d calls, want one per family", err, len(d.calls))
	}
	v4, v6 := d.calls[0].filters[0], d.calls[1].filters[0]
	for _, tc := range []struct {
		name      string
		proto     uint8
		dst       string
		port      uint16
		reply     string
		replyPort uint16
		want      bool
		unparsed  bool // ports 0, as the netlink library reports SCTP entries
	}{
		{"TCP SYN to the cluster IP that nothing DNATed", model.ProtoTCP, "10.96.0.10", 443, "10.96.0.10", 443, true, false},
		{"UDP to the cluster IP that nothing DNATed", model.ProtoUDP, "10.96.0.10", 443, "10.96.0.10", 443, true, false},
		{"SCTP to the cluster IP that nothing DNATed", model.ProtoSCTP, "10.96.0.20", 3868, "10.96.0.20", 3868, true, false},
		{"IPv6 TCP to the cluster IP that nothing DNATed", model.ProtoTCP, "fd00:96::10", 443, "fd00:96::10", 443, true, false},
		{"TCP connection DNATed to an endpoint", model.ProtoTCP, "10.96.0.10", 443, "10.244.1.2", 5353, false, false},
		{"IPv6 connection DNATed to an endpoint", model.ProtoTCP, "fd00:96::10", 443, "fd00:10::2", 5353, false, false},
		{"SCTP to a TCP-only cluster IP port", model.ProtoSCTP, "10.96.0.10", 443, "10.96.0.10", 443, false, false},
		{"another port of the cluster IP", model.ProtoTCP, "10.96.0.10", 80, "10.96.0.10", 80, false, false},
		{"external IP not DNATed", model.ProtoTCP, "192.0.2.10", 443, "192.0.2.10", 443, false, false},
		{"load-balancer IP not DNATed", model.ProtoTCP, "198.51.100.10", 443, "198.51.100.10", 443, false, false},
		{"node port not DNATed", model.ProtoTCP, "172.18.0.2", 30443, "172.18.0.2", 30443, false, false},
		{"an address outside the services", model.ProtoTCP, "10.96.0.99", 443, "10.96.0.99", 443, false, false},
		{"SCTP as netlink reports it, not DNATed", model.ProtoSCTP, "10.96.0.20", 0, "10.96.0.20", 0, true, true},
		{"SCTP as netlink reports it, DNATed", model.ProtoSCTP, "10.96.0.20", 0, "10.244.1.2", 0, false, true},
		{"SCTP as netlink reports it, to an external IP", model.ProtoSCTP, "192.0.2.10", 0, "192.0.2.10", 0, false, true},
	} {
		filter := v4
		if addr(tc.dst).Is6() {
			filter = v6
		}
		ct := entry(tc.proto, tc.dst, tc.port, tc.reply, tc.replyPort)
		if tc.unparsed {
			ct.Forward.SrcPort, ct.Reverse.DstPort = 0, 0
		}
		if got := filter.MatchConntrackFlow(ct); got != tc.want {
			t.Errorf("%s: match = %v, want %v (%s)", tc.name, got, tc.want, ct)
		}
	}
}

// TestUnparsedPortsNeedAddresses: an entry whose ports the netlink library did not
// parse (SCTP) is matched on addresses only by a flow that names both; a flow without
// addresses (a node port's) would select every entry of the protocol and matches none.
func TestUnparsedPortsNeedAddresses(t *testing.T) {
	ct := entry(model.ProtoSCTP, "172.18.0.2", 0, "172.18.0.2", 0)
	ct.Forward.SrcPort, ct.Reverse.DstPort = 0, 0
	nodePort := Flow{Protocol: model.ProtoSCTP, OrigDstPort: 30868, ReplySrcPort: 30868}
	if nodePort.Matches(ct) {
		t.Errorf("%s matches the SCTP entry %s", nodePort, ct)
	}
	half := Flow{Protocol: model.ProtoSCTP, OrigDstIP: addr("172.18.0.2"), OrigDstPort: 30868}
	if half.Matches(ct) {
		t.Errorf("%s matches the SCTP entry %s", half, ct)
	}
	// a TCP entry with ports 0 is not "unparsed": ports must be equal
	tcp := entry(model.ProtoTCP, "10.96.0.10", 0, "10.96.0.10", 0)
	tcp.Forward.SrcPort, tcp.Reverse.DstPort = 0, 0
	if f := escapedTo(model.ProtoTCP, "10.96.0.10", 80); f.Matches(tcp) {
		t.Errorf("%s matches %s", f, tcp)
	}
}
