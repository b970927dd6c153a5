package conntrack

import (
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/testnetns"
)

// ctEntry is a conntrack entry to insert with conntrack(8); the client port identifies it.
type ctEntry struct {
	proto       string
	client      string
	clientPort  int
	origDst     string
	origPort    int
	replySrc    string
	replyPort   int
	wantDeleted bool
	why         string
}

func (e ctEntry) insertArgs() []string {
	args := []string{"conntrack", "-I", "-p", e.proto,
		"-s", e.client, "-d", e.origDst, "--sport", strconv.Itoa(e.clientPort), "--dport", strconv.Itoa(e.origPort),
		"-r", e.replySrc, "-q", e.client, "--reply-port-src", strconv.Itoa(e.replyPort),
		"--reply-port-dst", strconv.Itoa(e.clientPort), "-t", "120", "-u", "SEEN_REPLY"}
	switch e.proto {
	case "tcp":
		args = append(args, "--state", "ESTABLISHED")
	case "sctp":
		args = append(args, "--state", "ESTABLISHED", "--orig-vtag", "1", "--reply-vtag", "2")
	}
	return args
}

// TestCleanKernel computes the stale flows of a real change with Stale, deletes them
// with Clean through a netlink handle in a throwaway namespace, and checks with
// conntrack(8) that exactly the intended entries are gone.
func TestCleanKernel(t *testing.T) {
	ns := testnetns.New(t)

	const pod, pod6, outside = "10.244.1.5", "fd00:10::5", "192.168.0.7"
	entries := []ctEntry{
		{"udp", pod, 40001, "10.96.0.10", 53, "10.244.1.2", 5353, false, "endpoint still in use"},
		{"udp", pod, 40002, "10.96.0.10", 53, "10.244.1.3", 5353, true, "endpoint removed"},
		{"udp", outside, 40003, "172.18.0.2", 30053, "10.244.1.3", 5353, true, "node port to the removed endpoint"},
		{"udp", outside, 40004, "172.18.0.2", 30053, "10.244.1.2", 5353, false, "node port to an endpoint in use"},
		{"tcp", pod, 40005, "10.96.0.10", 53, "10.244.1.3", 5353, false, "TCP is not touched"},
		{"udp", pod, 40006, "10.244.1.3", 5353, "10.244.1.3", 5353, false, "straight to the pod, not through a service"},
		{"udp", pod, 40007, "10.96.0.20", 53, "10.244.1.3", 5353, false, "another service still uses the endpoint"},
		{"udp", pod, 40008, "10.96.0.10", 53, "10.244.1.3", 53, false, "endpoint IP on another port"},
		{"udp", pod, 40009, "10.96.0.30", 123, "10.96.0.30", 123, true, "cached while the service had no endpoint"},
		{"udp", pod6, 40010, "fd00:96::10", 53, "fd00:10::3", 5353, true, "IPv6 endpoint removed"},
		{"udp", pod6, 40011, "fd00:96::10", 53, "fd00:10::2", 5353, false, "IPv6 endpoint still in use"},
	}
	prev, cur := kernelScenario()
	cleanAndCheck(t, ns, entries, Stale(prev, cur))
}

// kernelScenario: the UDP service dns (dual-stack, node port 30053) loses one endpoint
// per family; dns2 keeps the same endpoints; ntp gets its first endpoint; the TCP port
// of dns loses an endpoint too.
func kernelScenario() (prev, cur *model.Snapshot) {
	a, b := ready("10.244.1.2", 5353), ready("10.244.1.3", 5353)
	a6, b6 := ready("fd00:10::2", 5353), ready("fd00:10::3", 5353)
	svc := func(name string, proto uint8, ips []string, port, nodePort uint16, eps ...model.Endpoint) model.ServicePort {
		return model.ServicePort{
			Name:       model.ServicePortName{Namespace: "default", Name: name, Protocol: proto},
			ClusterIPs: addrs(ips...), Port: port, NodePort: nodePort, Endpoints: eps,
		}
	}
	dual := []string{"10.96.0.10", "fd00:96::10"}
	prev = snap(
		svc("dns", model.ProtoTCP, dual, 53, 0, a, b),
		svc("dns", model.ProtoUDP, dual, 53, 30053, a, b, a6, b6),
		svc("dns2", model.ProtoUDP, []string{"10.96.0.20"}, 53, 0, a, b),
		svc("ntp", model.ProtoUDP, []string{"10.96.0.30"}, 123, 0),
	)
	cur = snap(
		svc("dns", model.ProtoTCP, dual, 53, 0, a),
		svc("dns", model.ProtoUDP, dual, 53, 30053, a, a6),
		svc("dns2", model.ProtoUDP, []string{"10.96.0.20"}, 53, 0, a, b),
		svc("ntp", model.ProtoUDP, []string{"10.96.0.30"}, 123, 0, ready("10.244.1.4", 123)),
	)
	return prev, cur
}

// mustSeeOnlyOurEntries checks that the handle lists exactly the inserted entries: it
// is in the test namespace, not the machine's.
func mustSeeOnlyOurEntries(t *testing.T, h *netlink.Handle, entries []ctEntry) {
	t.Helper()
	var seen int
	for _, fam := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		flows, err := h.ConntrackTableList(netlink.ConntrackTable, fam)
		if err != nil {
			t.Fatalf("listing conntrack entries: %v", err)
		}
		seen += len(flows)
	}
	if seen != len(entries) {
		t.Fatalf("handle sees %d conntrack entries, inserted %d: not the test namespace?", seen, len(entries))
	}
}

var clientPortRE = regexp.MustCompile(`\bsport=(\d+)`)

// remainingClientPorts lists the namespace's conntrack entries (both families) by
// client port, sorted.
func remainingClientPorts(t *testing.T, ns *testnetns.NS) []int {
	t.Helper()
	var ports []int
	for _, fam := range []string{"ipv4", "ipv6"} {
		out := ns.MustRun(t, "", "conntrack", "-L", "-f", fam)
		for _, line := range strings.Split(out, "\n") {
			if m := clientPortRE.FindStringSubmatch(line); m != nil {
				p, _ := strconv.Atoi(m[1])
				ports = append(ports, p)
			}
		}
	}
	slices.Sort(ports)
	return ports
}

// TestCleanEscapedKernel deletes through netlink, in a throwaway namespace, the entries
// Escaped selects after a repair: connections to cluster IPs of every protocol that
// nothing DNATed go, DNATed ones and un-DNATed ones to other frontends stay.
func TestCleanEscapedKernel(t *testing.T) {
	ns := testnetns.New(t)
	const pod, pod6 = "10.244.1.5", "fd00:10::5"
	entries := []ctEntry{
		{"tcp", pod, 41001, "10.96.0.10", 80, "10.96.0.10", 80, true, "TCP to the cluster IP, not DNATed"},
		{"tcp", pod, 41002, "10.96.0.10", 80, "10.244.1.2", 8080, false, "TCP DNATed to an endpoint"},
		{"udp", pod, 41003, "10.96.0.10", 53, "10.96.0.10", 53, true, "UDP to the cluster IP, not DNATed"},
		{"sctp", pod, 41004, "10.96.0.20", 3868, "10.96.0.20", 3868, true, "SCTP to the cluster IP, not DNATed"},
		{"sctp", pod, 41005, "10.96.0.20", 3868, "10.244.1.3", 3868, false, "SCTP DNATed to an endpoint"},
		{"tcp", pod, 41006, "192.0.2.10", 80, "192.0.2.10", 80, false, "external IP, not DNATed: may be a real address"},
		{"tcp", pod, 41007, "10.96.0.10", 81, "10.96.0.10", 81, false, "a port the service does not have"},
		{"tcp", pod6, 41008, "fd00:96::10", 80, "fd00:96::10", 80, true, "IPv6 TCP to the cluster IP, not DNATed"},
		{"tcp", pod6, 41009, "fd00:96::10", 80, "fd00:10::2", 8080, false, "IPv6 TCP DNATed to an endpoint"},
	}
	svc := func(name string, proto uint8, port uint16, ips ...string) model.ServicePort {
		return model.ServicePort{Name: model.ServicePortName{Namespace: "default", Name: name, Protocol: proto},
			ClusterIPs: addrs(ips...), Port: port, ExternalIPs: addrs("192.0.2.10")}
	}
	cleanAndCheck(t, ns, entries, Escaped(snap(
		svc("web", model.ProtoTCP, 80, "10.96.0.10", "fd00:96::10"),
		svc("dns", model.ProtoUDP, 53, "10.96.0.10"),
		svc("diameter", model.ProtoSCTP, 3868, "10.96.0.20"),
	)))
}

// cleanAndCheck inserts entries into ns's conntrack table, deletes flows through
// netlink with a Cleaner, and checks that exactly the entries marked wantDeleted went.
func cleanAndCheck(t *testing.T, ns *testnetns.NS, entries []ctEntry, flows []Flow) {
	t.Helper()
	for _, e := range entries {
		ns.MustRun(t, "", e.insertArgs()...)
	}
	t.Logf("flows: %s", show(flows))
	h, err := netlink.NewHandleAt(netns.NsHandle(ns.FD), unix.NETLINK_NETFILTER)
	if err != nil {
		t.Fatalf("netlink handle in %s: %v", ns.Name, err)
	}
	defer h.Close()
	mustSeeOnlyOurEntries(t, h, entries)
	n, err := (&Cleaner{Deleter: h}).Clean(flows)
	if err != nil {
		t.Fatalf("Clean: %v", err)
	}
	var want []int
	wantDeleted := 0
	for _, e := range entries {
		if e.wantDeleted {
			wantDeleted++
		} else {
			want = append(want, e.clientPort)
		}
	}
	if n != wantDeleted {
		t.Errorf("Clean deleted %d entries, want %d", n, wantDeleted)
	}
	if got := remainingClientPorts(t, ns); !slices.Equal(got, want) {
		for _, e := range entries {
			if slices.Contains(got, e.clientPort) == e.wantDeleted {
				t.Errorf("entry %d (%s): deleted = %v, want %v", e.clientPort, e.why, !e.wantDeleted, e.wantDeleted)
			}
		}
		t.Fatalf("remaining entries (client ports) %v, want %v", got, want)
	}
}
