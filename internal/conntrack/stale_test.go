package conntrack

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/model"
)

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, addr(s))
	}
	return out
}

func ready(a string, port uint16) model.Endpoint {
	return model.Endpoint{Addr: addr(a), Port: port, Ready: true, Serving: true}
}

func terminating(a string, port uint16) model.Endpoint {
	return model.Endpoint{Addr: addr(a), Port: port, Serving: true, Terminating: true}
}

func notReady(a string, port uint16) model.Endpoint {
	return model.Endpoint{Addr: addr(a), Port: port}
}

// dns is UDP service port kube-system/dns:dns on 10.96.0.10:53 with the given endpoints.
func dns(eps ...model.Endpoint) model.ServicePort {
	return model.ServicePort{
		Name:       model.ServicePortName{Namespace: "kube-system", Name: "dns", Port: "dns", Protocol: model.ProtoUDP},
		ClusterIPs: addrs("10.96.0.10"),
		Port:       53,
		Endpoints:  eps,
	}
}

func with(sp model.ServicePort, edit func(*model.ServicePort)) model.ServicePort {
	edit(&sp)
	return sp
}

func snap(sps ...model.ServicePort) *model.Snapshot {
	return &model.Snapshot{Services: model.Ports(sps)}
}

// toEp selects entries from frontend ip:port DNATed to endpoint ep:epPort.
func toEp(ip string, port uint16, ep string, epPort uint16) Flow {
	return Flow{Protocol: model.ProtoUDP, IPv6: addr(ip).Is6(), OrigDstIP: addr(ip), OrigDstPort: port,
		ReplySrcIP: addr(ep), ReplySrcPort: epPort}
}

// nodePortToEp selects entries from node port np on any address DNATed to ep:epPort.
func nodePortToEp(np uint16, ep string, epPort uint16) Flow {
	return Flow{Protocol: model.ProtoUDP, IPv6: addr(ep).Is6(), OrigDstPort: np, ReplySrcIP: addr(ep), ReplySrcPort: epPort}
}

// notNATed selects un-DNATed entries to frontend ip:port.
func notNATed(ip string, port uint16) Flow {
	return Flow{Protocol: model.ProtoUDP, IPv6: addr(ip).Is6(), OrigDstIP: addr(ip), OrigDstPort: port,
		ReplySrcIP: addr(ip), ReplySrcPort: port}
}

func nodePortNotNATed(np uint16, v6 bool) Flow {
	return Flow{Protocol: model.ProtoUDP, IPv6: v6, OrigDstPort: np, ReplySrcPort: np}
}

func TestStale(t *testing.T) {
	a, b := ready("10.244.1.2", 5353), ready("10.244.1.3", 5353)
	a6, b6 := ready("fd00:10::2", 5353), ready("fd00:10::3", 5353)
	frontends := func(sp *model.ServicePort) {
		sp.NodePort = 30053
		sp.ExternalIPs = addrs("192.0.2.10")
		sp.LoadBalancerIPs = addrs("198.51.100.10")
	}
	dualStack := func(sp *model.ServicePort) {
		sp.ClusterIPs = addrs("10.96.0.10", "fd00:96::10")
		sp.NodePort = 30053
	}
	tcp := func(sp *model.ServicePort) { sp.Name.Protocol = model.ProtoTCP }
	sctp := func(sp *model.ServicePort) { sp.Name.Protocol = model.ProtoSCTP }
	named := func(name, ip string) func(*model.ServicePort) {
		return func(sp *model.ServicePort) { sp.Name.Name, sp.ClusterIPs = name, addrs(ip) }
	}

	tests := []struct {
		name      string
		prev, cur *model.Snapshot
		want      []Flow
	}{
		{name: "nothing", prev: nil, cur: nil, want: nil},
		{name: "unchanged", prev: snap(dns(a, b)), cur: snap(dns(a, b)), want: nil},
		{
			name: "endpoint removed",
			prev: snap(dns(a, b)), cur: snap(dns(a)),
			want: []Flow{toEp("10.96.0.10", 53, "10.244.1.3", 5353)},
		},
		{
			name: "endpoint no longer ready",
			prev: snap(dns(a, b)), cur: snap(dns(a, notReady("10.244.1.3", 5353))),
			want: []Flow{toEp("10.96.0.10", 53, "10.244.1.3", 5353)},
		},
		{
			// UsableEndpoints: a terminating endpoint is not used while others are ready.
			name: "endpoint terminating while others are ready",
			prev: snap(dns(a, b)), cur: snap(dns(a, terminating("10.244.1.3", 5353))),
			want: []Flow{toEp("10.96.0.10", 53, "10.244.1.3", 5353)},
		},
		{
			name: "last endpoint terminating stays in use",
			prev: snap(dns(a)), cur: snap(dns(terminating("10.244.1.2", 5353))),
			want: nil,
		},
		{
			name: "endpoint that was not in use removed",
			prev: snap(dns(a, notReady("10.244.1.3", 5353))), cur: snap(dns(a)),
			want: nil,
		},
		{
			name: "target port changed",
			prev: snap(dns(a)), cur: snap(dns(ready("10.244.1.2", 53))),
			want: []Flow{toEp("10.96.0.10", 53, "10.244.1.2", 5353)},
		},
		{
			name: "every frontend to a removed endpoint",
			prev: snap(with(dns(a, b), frontends)), cur: snap(with(dns(a), frontends)),
			want: []Flow{
				toEp("10.96.0.10", 53, "10.244.1.3", 5353),
				toEp("192.0.2.10", 53, "10.244.1.3", 5353),
				toEp("198.51.100.10", 53, "10.244.1.3", 5353),
				nodePortToEp(30053, "10.244.1.3", 5353),
			},
		},
		{
			name: "service deleted",
			prev: snap(with(dns(a), frontends)), cur: snap(),
			want: []Flow{
				toEp("10.96.0.10", 53, "10.244.1.2", 5353),
				toEp("192.0.2.10", 53, "10.244.1.2", 5353),
				toEp("198.51.100.10", 53, "10.244.1.2", 5353),
				nodePortToEp(30053, "10.244.1.2", 5353),
			},
		},
		{
			name: "last endpoint removed",
			prev: snap(dns(a, b)), cur: snap(dns()),
			want: []Flow{toEp("10.96.0.10", 53, "10.244.1.2", 5353), toEp("10.96.0.10", 53, "10.244.1.3", 5353)},
		},
		{
			name: "first endpoint appears",
			prev: snap(with(dns(notReady("10.244.1.2", 5353)), frontends)), cur: snap(with(dns(a), frontends)),
			want: []Flow{
				notNATed("10.96.0.10", 53),
				notNATed("192.0.2.10", 53),
				notNATed("198.51.100.10", 53),
				nodePortNotNATed(30053, false),
			},
		},
		{
			name: "new service with endpoints",
			prev: snap(), cur: snap(with(dns(a), frontends)),
			want: []Flow{
				notNATed("10.96.0.10", 53),
				notNATed("192.0.2.10", 53),
				notNATed("198.51.100.10", 53),
				nodePortNotNATed(30053, false),
			},
		},
		{
			name: "restart: no previous snapshot",
			prev: nil, cur: snap(dns(a, b)),
			want: []Flow{notNATed("10.96.0.10", 53)},
		},
		{
			name: "second endpoint appears",
			prev: snap(dns(a)), cur: snap(dns(a, b)),
			want: nil,
		},
		{name: "TCP endpoint removed", prev: snap(with(dns(a, b), tcp)), cur: snap(with(dns(a), tcp)), want: nil},
		{name: "SCTP service deleted", prev: snap(with(dns(a, b), sctp)), cur: snap(), want: nil},
		{name: "TCP service gets its first endpoint", prev: snap(with(dns(), tcp)), cur: snap(with(dns(a), tcp)), want: nil},
		{
			name: "IPv6 endpoint removed from a dual-stack service",
			prev: snap(with(dns(a, a6, b6), dualStack)), cur: snap(with(dns(a, a6), dualStack)),
			want: []Flow{toEp("fd00:96::10", 53, "fd00:10::3", 5353), nodePortToEp(30053, "fd00:10::3", 5353)},
		},
		{
			name: "first IPv6 endpoint of a dual-stack service",
			prev: snap(with(dns(a), dualStack)), cur: snap(with(dns(a, b6), dualStack)),
			want: []Flow{notNATed("fd00:96::10", 53), nodePortNotNATed(30053, true)},
		},
		{
			// Per family: IPv6 falls back to its terminating endpoint although IPv4
			// has a ready one.
			name: "terminating fallback is per family",
			prev: snap(with(dns(a, a6), dualStack)), cur: snap(with(dns(a, terminating("fd00:10::2", 5353)), dualStack)),
			want: nil,
		},
		{
			name: "endpoint shared by two services, removed from one",
			prev: snap(with(dns(a, b), named("dns", "10.96.0.10")), with(dns(a, b), named("dns2", "10.96.0.20"))),
			cur:  snap(with(dns(a, b), named("dns", "10.96.0.10")), with(dns(a), named("dns2", "10.96.0.20"))),
			want: []Flow{toEp("10.96.0.20", 53, "10.244.1.3", 5353)},
		},
		{
			name: "duplicate frontends give one flow",
			prev: snap(with(dns(a, b), func(sp *model.ServicePort) { sp.ExternalIPs = addrs("192.0.2.10", "192.0.2.10") })),
			cur:  snap(with(dns(a), func(sp *model.ServicePort) { sp.ExternalIPs = addrs("192.0.2.10", "192.0.2.10") })),
			want: []Flow{toEp("10.96.0.10", 53, "10.244.1.3", 5353), toEp("192.0.2.10", 53, "10.244.1.3", 5353)},
		},
	}
	seen := map[string]bool{}
	for _, tc := range tests {
		if seen[tc.name] {
			t.Fatalf("duplicate case name %q", tc.name)
		}
		seen[tc.name] = true
		t.Run(tc.name, func(t *testing.T) {
			got := Stale(tc.prev, tc.cur)
			if !slices.Equal(got, tc.want) {
				t.Errorf("Stale:\ngot  %s\nwant %s", show(got), show(tc.want))
			}
		})
	}
}

// TestStaleWith checks that the usable endpoints come from the given function: here
// only this node's endpoints count.
func TestStaleWith(t *testing.T) {
	local := func(sp *model.ServicePort) []model.Endpoint {
		var out []model.Endpoint
		for _, e := range Usable(sp) {
			if e.NodeName == "n1" {
				out = append(out, e)
			}
		}
		return out
	}
	a, b := ready("10.244.1.2", 5353), ready("10.244.2.3", 5353)
	a.NodeName, b.NodeName = "n1", "n2"
	got := StaleWith(snap(dns(a, b)), snap(dns(b)), local)
	want := []Flow{toEp("10.96.0.10", 53, "10.244.1.2", 5353)}
	if !slices.Equal(got, want) {
		t.Errorf("got %s, want %s", show(got), show(want))
	}
	// b was never usable under this function: its removal selects nothing.
	if got := StaleWith(snap(dns(a, b)), snap(dns(a)), local); got != nil {
		t.Errorf("removing an endpoint that was not in use: got %s", show(got))
	}
}

func TestFlowString(t *testing.T) {
	for _, tc := range []struct {
		f    Flow
		want string
	}{
		{toEp("10.96.0.10", 53, "10.244.1.3", 5353),
			"-f ipv4 -p udp --orig-dst 10.96.0.10 --orig-port-dst 53 --reply-src 10.244.1.3 --reply-port-src 5353"},
		{nodePortNotNATed(30053, true), "-f ipv6 -p udp --orig-port-dst 30053 --reply-port-src 30053"},
	} {
		if got := tc.f.String(); got != tc.want {
			t.Errorf("String() = %q, want %q", got, tc.want)
		}
	}
}

func show(flows []Flow) string {
	var s []string
	for _, f := range flows {
		s = append(s, "\n  "+f.String())
	}
	return "[" + strings.Join(s, "") + "]"
}

// Only the frontends a port won select flows: a tenant port declaring kube-dns's
// cluster IP as an externalIP (refused) and a node port it lost, whose endpoint is the
// DNS pod, deletes none of kube-dns's entries when it drops that endpoint; the
// declared frontends (Won nil) would.
func TestStaleFromWonFrontends(t *testing.T) {
	pod, own := ready("10.244.1.53", 53), ready("10.244.9.9", 53)
	tenant := func(eps ...model.Endpoint) model.ServicePort {
		return model.ServicePort{
			Name:       model.ServicePortName{Namespace: "tenant", Name: "evil", Port: "dns", Protocol: model.ProtoUDP},
			ClusterIPs: addrs("10.96.0.99"), ExternalIPs: addrs("10.96.0.10"), NodePort: 30053, Port: 53, Endpoints: eps,
		}
	}
	won := Won{
		{Namespace: "kube-system", Name: "dns", Port: "dns", Protocol: model.ProtoUDP}: {IPs: addrs("10.96.0.10")},
		{Namespace: "tenant", Name: "evil", Port: "dns", Protocol: model.ProtoUDP}:     {IPs: addrs("10.96.0.99")},
	}
	prev, cur := snap(dns(pod), tenant(pod, own)), snap(dns(pod), tenant(own))
	got := StaleFrom(Programmed{prev, won}, Programmed{cur, won}, Usable)
	if want := []Flow{toEp("10.96.0.99", 53, "10.244.1.53", 53)}; !slices.Equal(got, want) {
		t.Errorf("with the won frontends:\n got  %v\n want %v", got, want)
	}
	declared := StaleWith(prev, cur, Usable)
	if !slices.Contains(declared, toEp("10.96.0.10", 53, "10.244.1.53", 53)) || !slices.Contains(declared, nodePortToEp(30053, "10.244.1.53", 53)) {
		t.Errorf("the declared frontends do not select kube-dns's entries (the case is moot): %v", declared)
	}
	// a port that won nothing (set aside) selects nothing
	if got := StaleFrom(Programmed{prev, Won{}}, Programmed{cur, Won{}}, Usable); len(got) != 0 {
		t.Errorf("a port without frontends selects %v", got)
	}
}

// TestServingOrTerminating: with --udp-keep-terminating-flows an endpoint's UDP flows
// outlive its readiness while it terminates, and go when it leaves the slice; a failed
// readiness probe without termination still moves them, as with Serving.
func TestServingOrTerminating(t *testing.T) {
	a, b := ready("10.244.1.2", 5353), ready("10.244.2.3", 5353)
	stopping := model.Endpoint{Addr: a.Addr, Port: a.Port, Terminating: true} // neither ready nor serving
	failed := notReady("10.244.1.2", 5353)                                    // not ready, not terminating
	toA := []Flow{toEp("10.96.0.10", 53, "10.244.1.2", 5353)}
	for _, tc := range []struct {
		name      string
		usable    UsableFunc
		prev, cur model.ServicePort
		want      []Flow
	}{
		{"terminating, not serving: kept", ServingOrTerminating, dns(a, b), dns(stopping, b), nil},
		{"terminating, not serving: deleted by Serving", Serving, dns(a, b), dns(stopping, b), toA},
		{"terminating, serving: kept by both", Serving, dns(a, b), dns(terminating("10.244.1.2", 5353), b), nil},
		{"terminating endpoint leaves the slice", ServingOrTerminating, dns(stopping, b), dns(b), toA},
		{"failed probe, not terminating: deleted", ServingOrTerminating, dns(a, b), dns(failed, b), toA},
		{"removed at once", ServingOrTerminating, dns(a, b), dns(b), toA},
	} {
		got := StaleWith(snap(tc.prev), snap(tc.cur), tc.usable)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: got %s, want %s", tc.name, show(got), show(tc.want))
		}
	}
}
