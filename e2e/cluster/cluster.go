// Package cluster runs a throw-away Kubernetes control plane (etcd + kube-apiserver) and
// a dual-stack, Calico-style pod network made of network namespaces: one node namespace
// (more with AddNode), pod namespaces routed point-to-point through their node, and an
// external client on the nodes' LAN. nftproxy can so be tested end to end without
// touching the host's root network namespace. See e2e/README.md for the layout.
package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"k8s.io/client-go/kubernetes"
)

// KubeconfigEnv is reserved for running the suite against an existing (kind) cluster.
const KubeconfigEnv = "NFTPROXY_E2E_KUBECONFIG"

// Fixed addressing of the local cluster (documentation / test / ULA ranges only). Node N
// (1-based) gets nodeIP+N-1 and the pod CIDRs 10.244.N.0/24 and fd00:244:0:N::/64.
var (
	nodeIP        = netip.MustParseAddr("192.0.2.10")
	nodeIPv6      = netip.MustParseAddr("fd00:192::10")
	externalIP    = netip.MustParseAddr("192.0.2.100")
	externalIPv6  = netip.MustParseAddr("fd00:192::100")
	linkNet       = 24 // prefix length of the LAN (nodes and external client), IPv4
	linkNet6      = 64 // and IPv6
	podCIDR       = netip.MustParsePrefix("10.244.0.0/16")
	podCIDRv6     = netip.MustParsePrefix("fd00:244::/56")
	serviceCIDR   = netip.MustParsePrefix("10.96.0.0/16")
	serviceCIDRv6 = netip.MustParsePrefix("fd00:96::/112")
	podGateway    = "169.254.1.1" // on the node side of every pod veth
	podGateway6   = "fe80::1"
	lanBridge     = "br0"               // in the external namespace
	lanBridgeMAC  = "02:00:c0:00:02:64" // fixed, so it does not change as nodes join
	maxNodes      = 50                  // node IPs .10-.59, below the client's .100
)

// Config configures Start. All fields are optional.
type Config struct {
	APIServer string // path to kube-apiserver; empty: run e2e/hack/build-k8s.sh
	Etcd      string // etcd binary; default EtcdBinary's
	WorkDir   string // certs, etcd data, logs, kubeconfig; default: a new temp dir
	Logf      func(format string, args ...any)
	// EtcdDataDir is etcd's data directory; default WorkDir/etcd. A tmpfs directory
	// (e.g. under /dev/shm) makes writing tens of thousands of objects much faster.
	EtcdDataDir string
	// APIServerArgs are extra kube-apiserver flags, appended after the harness's own.
	APIServerArgs []string
}

// Cluster is a running local cluster. Create it with Start, tear it down with Stop.
//
// The Node* fields describe the first node, "node-1", where the control plane runs; more
// nodes can be added with AddNode.
type Cluster struct {
	Prefix        string // random prefix of every netns / link name of this cluster
	NodeName      string
	NodeNS        string // netns of the node: nftproxy, etcd and kube-apiserver run here
	NodeIP        netip.Addr
	NodeIPv6      netip.Addr
	ExternalNS    string // netns of an off-cluster client on the nodes' LAN
	ExternalIP    netip.Addr
	ExternalIPv6  netip.Addr
	PodCIDR       netip.Prefix // cluster pod CIDR; node-1's pods are in NodePodCIDR
	PodCIDRv6     netip.Prefix
	NodePodCIDR   netip.Prefix
	NodePodCIDRv6 netip.Prefix
	ServiceCIDR   netip.Prefix
	ServiceCIDRv6 netip.Prefix
	Kubeconfig    string               // for processes inside any node namespace
	Client        kubernetes.Interface // for the test process (dials through NodeNS)
	WorkDir       string
	EtcdVersion   string // what the etcd binary reports ("3.7.0")

	h       *Harness // processes, namespaces and the work directory
	logf    func(format string, args ...any)
	echoBin string

	mu    sync.Mutex
	pods  map[string]*Pod
	nodes []*Node // nodes[0] is node-1
}

// Start creates the namespaces, starts etcd and kube-apiserver inside the node
// namespace and registers the node. On error everything already created is removed.
func Start(ctx context.Context, cfg Config) (_ *Cluster, err error) {
	if os.Getenv(KubeconfigEnv) != "" {
		return nil, fmt.Errorf("%s is reserved for running the suite against an existing (kind) cluster, "+
			"which is not implemented yet (see e2e/README.md); unset it to use the local netns cluster", KubeconfigEnv)
	}
	if err := CheckPrerequisites(); err != nil {
		return nil, err
	}
	h, err := NewHarness("cluster", "np"+randHex(3), cfg.WorkDir, "nftproxy-e2e-", cfg.Logf)
	if err != nil {
		return nil, err
	}
	c := &Cluster{
		h:             h,
		Prefix:        h.Prefix,
		ExternalIP:    externalIP,
		ExternalIPv6:  externalIPv6,
		PodCIDR:       podCIDR,
		PodCIDRv6:     podCIDRv6,
		ServiceCIDR:   serviceCIDR,
		ServiceCIDRv6: serviceCIDRv6,
		WorkDir:       h.WorkDir,
		logf:          h.logf,
		pods:          map[string]*Pod{},
	}
	n1 := c.newNode(1, "node-1")
	c.nodes = []*Node{n1}
	c.NodeName, c.NodeNS = n1.Name, n1.NS
	c.NodeIP, c.NodeIPv6 = n1.IP, n1.IPv6
	c.NodePodCIDR, c.NodePodCIDRv6 = n1.PodCIDR, n1.PodCIDRv6
	c.ExternalNS = c.Prefix + "-ext"
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	c.logf("cluster %s: workdir %s", c.Prefix, c.WorkDir)

	apiserver := cfg.APIServer
	if apiserver == "" {
		if apiserver, err = buildAPIServer(ctx); err != nil {
			return nil, err
		}
	}
	etcd := cfg.Etcd
	if etcd == "" {
		if etcd, err = EtcdBinary(ctx); err != nil {
			return nil, err
		}
	}
	if c.EtcdVersion, err = EtcdVersion(ctx, etcd); err != nil {
		return nil, err
	}
	if c.echoBin, err = BuildBinaries(ctx, filepath.Join(c.WorkDir, "bin")); err != nil {
		return nil, err
	}
	if err := c.setupNetwork(ctx); err != nil {
		return nil, fmt.Errorf("network setup: %w", err)
	}
	if err := c.startControlPlane(ctx, etcd, apiserver, cfg); err != nil {
		return nil, fmt.Errorf("control plane: %w", err)
	}
	c.logf("cluster %s: ready (node %s, apiserver https://%s:6443)", c.Prefix, c.NodeNS, c.NodeIP)
	return c, nil
}

// CheckPrerequisites reports what is missing to run a local cluster (root, ip, etcd, ...).
func CheckPrerequisites() error {
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root (network namespaces)")
	}
	for _, bin := range []string{"ip", "sysctl", "go"} {
		if _, err := exec.LookPath(bin); err != nil {
			missing = append(missing, bin+" on PATH")
		}
	}
	if _, err := os.Stat("/proc/sys/net/ipv6"); err != nil {
		missing = append(missing, "IPv6 support in the kernel (the cluster is dual-stack)")
	}
	if len(missing) > 0 {
		return fmt.Errorf("e2e prerequisites missing: %s", strings.Join(missing, ", "))
	}
	return nil
}

// setupNetwork creates the external namespace with the LAN bridge, and node-1.
func (c *Cluster) setupNetwork(ctx context.Context) error {
	if err := c.addNetns(ctx, c.ExternalNS); err != nil {
		return err
	}
	// The external client is a plain host (no forwarding) on the LAN bridge and the
	// nodes' default gateway: a packet a node sends there that is not for the client
	// itself ends there.
	if err := c.ip(ctx, c.ExternalNS,
		fmt.Sprintf("link add %s address %s type bridge", lanBridge, lanBridgeMAC),
		fmt.Sprintf("addr add %s/%d dev %s", c.ExternalIP, linkNet, lanBridge),
		fmt.Sprintf("addr add %s/%d dev %s nodad", c.ExternalIPv6, linkNet6, lanBridge),
		"link set "+lanBridge+" up",
		fmt.Sprintf("route add %s via %s", c.ServiceCIDR, c.NodeIP),
		fmt.Sprintf("route add %s via %s", c.PodCIDR, c.NodeIP),
		fmt.Sprintf("route add %s via %s", c.ServiceCIDRv6, c.NodeIPv6),
		fmt.Sprintf("route add %s via %s", c.PodCIDRv6, c.NodeIPv6),
	); err != nil {
		return err
	}
	return c.setupNode(ctx, c.nodes[0])
}

// addNetns creates a namespace with lo up and IPv6 duplicate address detection off
// (addresses are usable at once instead of "tentative" for a second or two).
func (c *Cluster) addNetns(ctx context.Context, ns string) error {
	if err := c.h.AddNetns(ctx, ns); err != nil {
		return err
	}
	return c.sysctl(ctx, ns, "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0")
}

// sysctl sets kernel parameters inside namespace ns (never in the root namespace).
func (c *Cluster) sysctl(ctx context.Context, ns string, kvs ...string) error {
	if out, err := c.Exec(ctx, ns, append([]string{"sysctl", "-qw"}, kvs...)...); err != nil {
		return fmt.Errorf("sysctl -w %s in %s: %w: %s", strings.Join(kvs, " "), ns, err, out)
	}
	return nil
}

func (c *Cluster) delNetns(ns string) error { return c.h.DelNetns(ns) }

func (c *Cluster) ip(ctx context.Context, ns string, cmds ...string) error {
	return c.h.IP(ctx, ns, cmds...)
}

// Stop kills every process started through the cluster (in reverse start order:
// workloads and nftproxy first, etcd last), deletes its namespaces and removes the work
// directory if Start created it (unless KEEP_E2E_WORKDIR=1). It is safe to call more
// than once.
func (c *Cluster) Stop() { c.h.Stop(nil) }

func randHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// Tails returns the last n lines of every process log (for a failed test).
func (c *Cluster) Tails(n int) string { return c.h.Tails(n) }
