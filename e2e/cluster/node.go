package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Node is a node network namespace on the LAN shared with the external client. Its pods
// (AddPodOn) are routed point-to-point through it; the other nodes reach them via its
// LAN addresses.
type Node struct {
	Name      string
	NS        string     // network namespace (node-1: <prefix>-node, node-N: <prefix>-nodeN)
	IP        netip.Addr // InternalIP on the LAN: 192.0.2.(9+N)
	IPv6      netip.Addr // fd00:192::(0x0f+N) — fd00:192::10 for node-1
	PodCIDR   netip.Prefix
	PodCIDRv6 netip.Prefix
	LinkIf    string // the node's interface on the LAN (named <prefix>ext in every node)

	index   int // N
	nextPod int // last octet / group of the next pod IP
}

func (c *Cluster) newNode(index int, name string) *Node {
	n := &Node{
		Name:    name,
		NS:      c.Prefix + "-node",
		IP:      addOffset(nodeIP, index-1),
		IPv6:    addOffset(nodeIPv6, index-1),
		LinkIf:  c.Prefix + "ext",
		index:   index,
		nextPod: 2,
	}
	if index > 1 {
		n.NS = fmt.Sprintf("%s-node%d", c.Prefix, index)
	}
	v4 := podCIDR.Addr().As4()
	v4[2] = byte(index)
	n.PodCIDR = netip.PrefixFrom(netip.AddrFrom4(v4), 24)
	v6 := podCIDRv6.Addr().As16()
	v6[6], v6[7] = byte(index>>8), byte(index) // fd00:244:0:N::/64, inside fd00:244::/56
	n.PodCIDRv6 = netip.PrefixFrom(netip.AddrFrom16(v6), 64)
	return n
}

func addOffset(a netip.Addr, n int) netip.Addr {
	for range n {
		a = a.Next()
	}
	return a
}

// setupNode creates the node's namespace and connects it to the LAN bridge in the
// external namespace, with a default route via the external client (a real node's
// default gateway) for both families.
func (c *Cluster) setupNode(ctx context.Context, n *Node) error {
	if err := c.addNetns(ctx, n.NS); err != nil {
		return err
	}
	if err := c.sysctl(ctx, n.NS,
		"net.ipv4.ip_forward=1", "net.ipv4.icmp_ratelimit=0",
		"net.ipv6.conf.all.forwarding=1", "net.ipv6.icmp.ratelimit=0",
	); err != nil {
		return err
	}
	lanPort := fmt.Sprintf("node%d", n.index) // the bridge port in the external namespace
	if err := c.ip(ctx, n.NS,
		fmt.Sprintf("link add %s type veth peer name %s netns %s", n.LinkIf, lanPort, c.ExternalNS),
		fmt.Sprintf("addr add %s/%d dev %s", n.IP, linkNet, n.LinkIf),
		fmt.Sprintf("addr add %s/%d dev %s nodad", n.IPv6, linkNet6, n.LinkIf),
		"link set "+n.LinkIf+" up",
		fmt.Sprintf("route add default via %s dev %s", c.ExternalIP, n.LinkIf),
		fmt.Sprintf("route add ::/0 via %s dev %s", c.ExternalIPv6, n.LinkIf),
	); err != nil {
		return err
	}
	return c.ip(ctx, c.ExternalNS,
		fmt.Sprintf("link set %s master %s", lanPort, lanBridge),
		fmt.Sprintf("link set %s up", lanPort),
	)
}

// AddNode adds node N (N = number of nodes + 1) named name: a namespace on the LAN with
// IPs 192.0.2.(9+N) and fd00:192::(0x0f+N), pod CIDRs 10.244.N.0/24 and fd00:244:0:N::/64,
// routes to and from every other node's pod CIDRs via the node IPs (and from the
// external client), and a Ready Node object. Processes in it reach the apiserver at
// https://<node-1 IP>:6443 with c.Kubeconfig.
func (c *Cluster) AddNode(ctx context.Context, name string) (*Node, error) {
	c.mu.Lock()
	for _, n := range c.nodes {
		if n.Name == name {
			c.mu.Unlock()
			return nil, fmt.Errorf("node %q already exists", name)
		}
	}
	if len(c.nodes) >= maxNodes {
		c.mu.Unlock()
		return nil, fmt.Errorf("at most %d nodes", maxNodes)
	}
	n := c.newNode(len(c.nodes)+1, name)
	others := append([]*Node(nil), c.nodes...)
	c.mu.Unlock()

	if err := c.setupNode(ctx, n); err != nil {
		return nil, fmt.Errorf("add node %s: %w", name, err)
	}
	var toOthers []string
	for _, o := range others {
		toOthers = append(toOthers,
			fmt.Sprintf("route add %s via %s", o.PodCIDR, o.IP),
			fmt.Sprintf("route add %s via %s", o.PodCIDRv6, o.IPv6))
		if err := c.ip(ctx, o.NS,
			fmt.Sprintf("route add %s via %s", n.PodCIDR, n.IP),
			fmt.Sprintf("route add %s via %s", n.PodCIDRv6, n.IPv6),
		); err != nil {
			return nil, fmt.Errorf("add node %s: %w", name, err)
		}
	}
	if err := c.ip(ctx, n.NS, toOthers...); err != nil {
		return nil, fmt.Errorf("add node %s: %w", name, err)
	}
	// More specific than the external client's routes for the whole pod CIDRs via node-1.
	if err := c.ip(ctx, c.ExternalNS,
		fmt.Sprintf("route add %s via %s", n.PodCIDR, n.IP),
		fmt.Sprintf("route add %s via %s", n.PodCIDRv6, n.IPv6),
	); err != nil {
		return nil, fmt.Errorf("add node %s: %w", name, err)
	}
	if err := c.registerNode(ctx, n); err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.nodes = append(c.nodes, n)
	c.mu.Unlock()
	c.logf("cluster %s: node %s in %s (%s, %s, pods %s, %s)", c.Prefix, n.Name, n.NS, n.IP, n.IPv6, n.PodCIDR, n.PodCIDRv6)
	return n, nil
}

// Nodes returns the cluster's nodes, node-1 first.
func (c *Cluster) Nodes() []*Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*Node(nil), c.nodes...)
}

// Node returns the node called name, or nil.
func (c *Cluster) Node(name string) *Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// registerNode creates the Node object the way a kubelet would (addresses of both
// families, pod CIDRs, Ready).
func (c *Cluster) registerNode(ctx context.Context, n *Node) error {
	nodes := c.Client.CoreV1().Nodes()
	cidrs := []string{n.PodCIDR.String(), n.PodCIDRv6.String()}
	node, err := nodes.Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:   n.Name,
			Labels: map[string]string{corev1.LabelHostname: n.Name},
		},
		Spec: corev1.NodeSpec{PodCIDR: cidrs[0], PodCIDRs: cidrs},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create node %s: %w", n.Name, err)
	}
	now := metav1.Now()
	node.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: n.IP.String()},
		{Type: corev1.NodeInternalIP, Address: n.IPv6.String()},
		{Type: corev1.NodeHostName, Address: n.Name},
	}
	node.Status.Conditions = []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "E2E",
		LastHeartbeatTime: now, LastTransitionTime: now,
	}}
	if _, err := nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update node %s status: %w", n.Name, err)
	}
	return nil
}

// SetZone sets the node's topology.kubernetes.io/zone label (zone "" removes it).
func (c *Cluster) SetZone(ctx context.Context, nodeName, zone string) error {
	var value any = zone
	if zone == "" {
		value = nil // JSON merge patch: delete
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"labels": map[string]any{corev1.LabelTopologyZone: value}},
	})
	if err != nil {
		return err
	}
	if _, err := c.Client.CoreV1().Nodes().Patch(ctx, nodeName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("set zone of node %s: %w", nodeName, err)
	}
	return nil
}
