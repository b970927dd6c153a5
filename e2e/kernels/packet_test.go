// Package kernels holds the packet test that `make kernels` runs in each guest kernel
// beside the nf_tables kernel tests (e2e/hack/kernels.sh). It runs on the host too, as
// any kernel test: as root, in namespaces it creates.
package kernels

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/internal/testrules"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

// TestClusterIPConnection programs nftproxy's compiled ruleset over netlink into a node
// namespace between a client and an endpoint namespace:
//
//	client 192.168.1.2 ── 192.168.1.1 node 192.168.2.1 ── 192.168.2.2 endpoint (10.244.0.1)
//
// and makes TCP connections to the ClusterIP 10.96.0.10:80, which must reach the
// endpoint 10.244.0.1:8080 through the DNAT, masqueraded to the node's address (the
// client is outside the cluster CIDR). A service without endpoints must be refused.
func TestClusterIPConnection(t *testing.T) {
	client, node, ep := topology(t)
	node.MustRun(t, "", "ip", "route", "add", "default", "via", "192.168.2.2")

	// The endpoint answers each connection with the address it was reached on and the
	// peer it saw.
	var l net.Listener
	if err := ep.Do(func() (err error) { l, err = net.Listen("tcp4", "10.244.0.1:8080"); return err }); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "%s %s\n", c.LocalAddr(), c.RemoteAddr().(*net.TCPAddr).IP)
			c.Close()
		}
	}()

	web := testrules.Service("web", "10.96.0.10", 0, 0, 1) // endpoint 10.244.0.1:8080
	empty := testrules.Service("empty", "10.96.0.11", 0, 0, 0)
	rs, _ := compile.NewCompiler(testrules.Config(), compile.NewSlots()).
		Compile(&model.Snapshot{Services: model.Ports([]model.ServicePort{web, empty})})
	if _, err := kernel.New(kernel.WithNetNS(node.FD)).Apply(rs); err != nil {
		t.Fatalf("applying the ruleset: %v", err)
	}

	// Bounded: 5 connections, each within 5 s.
	for i := 0; i < 5; i++ {
		c, err := client.DialTCP("192.168.1.2", "10.96.0.10", 80)
		if err != nil {
			t.Fatalf("connection %d to 10.96.0.10:80: %v\n%s", i, err, node.MustRun(t, "", "nft", "list", "ruleset"))
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if err != nil {
			t.Fatalf("connection %d: reading the endpoint's answer: %v", i, err)
		}
		if got, want := strings.TrimSpace(line), "10.244.0.1:8080 192.168.2.1"; got != want {
			t.Fatalf("connection %d: endpoint answered %q, want %q (reached on, seen from)", i, got, want)
		}
	}

	c, err := client.DialTCP("192.168.1.2", "10.96.0.11", 80)
	if err == nil {
		c.Close()
		t.Fatal("a connection to a service without endpoints was accepted")
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("service without endpoints: %v, want connection refused (the ruleset's reject)", err)
	}
}

// topology builds the three namespaces of TestClusterIPConnection's picture: client,
// node (forwarding, with a route to the cluster CIDR via the endpoint) and endpoint.
func topology(t *testing.T) (client, node, ep *testnetns.NS) {
	t.Helper()
	client, node, ep = testnetns.New(t), testnetns.New(t), testnetns.New(t)
	node.MustRun(t, "", "ip", "link", "add", "nd0", "type", "veth", "peer", "name", "cl0", "netns", client.Name)
	node.MustRun(t, "", "ip", "link", "add", "nd1", "type", "veth", "peer", "name", "ep0", "netns", ep.Name)
	for _, c := range []struct {
		ns   *testnetns.NS
		args string
	}{
		{node, "ip addr add 192.168.1.1/24 dev nd0"},
		{node, "ip addr add 192.168.2.1/24 dev nd1"},
		{node, "ip link set nd0 up"},
		{node, "ip link set nd1 up"},
		{node, "ip link set lo up"},
		{node, "ip route add 10.244.0.0/16 via 192.168.2.2"},
		{node, "sysctl -qw net.ipv4.ip_forward=1"},
		{client, "ip addr add 192.168.1.2/24 dev cl0"},
		{client, "ip link set cl0 up"},
		{client, "ip route add default via 192.168.1.1"},
		{ep, "ip addr add 192.168.2.2/24 dev ep0"},
		{ep, "ip addr add 10.244.0.1/32 dev ep0"},
		{ep, "ip link set ep0 up"},
		{ep, "ip route add default via 192.168.2.1"},
	} {
		c.ns.MustRun(t, "", strings.Fields(c.args)...)
	}
	return client, node, ep
}
