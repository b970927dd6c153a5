// Package cluster runs a throw-away single-node Kubernetes control plane (etcd +
// kube-apiserver) and a Calico-style pod network made of network namespaces, so that
// nftproxy can be tested end to end without touching the host's root network namespace.
// See e2e/README.md for the layout.
package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
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

// Fixed addressing of the local cluster (documentation / test ranges only).
var (
	nodeIP      = netip.MustParseAddr("192.0.2.10")
	externalIP  = netip.MustParseAddr("192.0.2.100")
	linkNet     = 24 // prefix length of the node <-> external link
	podCIDR     = netip.MustParsePrefix("10.244.0.0/16")
	nodePodCIDR = netip.MustParsePrefix("10.244.1.0/24")
	serviceCIDR = netip.MustParsePrefix("10.96.0.0/16")
	podGateway  = "169.254.1.1"
)

// Config configures Start. All fields are optional.
type Config struct {
	APIServer string // path to kube-apiserver; empty: run e2e/hack/build-k8s.sh
	Etcd      string // etcd binary; default "etcd" from PATH
	WorkDir   string // certs, etcd data, logs, kubeconfig; default: a new temp dir
	Logf      func(format string, args ...any)
}

// Cluster is a running local cluster. Create it with Start, tear it down with Stop.
type Cluster struct {
	Prefix      string // random prefix of every netns / link name of this cluster
	NodeName    string
	NodeNS      string // netns of the node: nftproxy, etcd and kube-apiserver run here
	NodeIP      netip.Addr
	ExternalNS  string // netns of an off-cluster client routed to the node
	ExternalIP  netip.Addr
	PodCIDR     netip.Prefix // cluster pod CIDR; this node's pods are in NodePodCIDR
	NodePodCIDR netip.Prefix
	ServiceCIDR netip.Prefix
	Kubeconfig  string               // for processes inside NodeNS
	Client      kubernetes.Interface // for the test process (dials through NodeNS)
	WorkDir     string

	logf       func(format string, args ...any)
	echoBin    string
	ownWorkDir bool

	mu      sync.Mutex
	procs   []*Process
	netns   []string // created namespaces, in creation order
	pods    map[string]*Pod
	nextPod int // last octet of the next pod IP
	stopped bool
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
	c := &Cluster{
		Prefix:      "np" + randHex(3),
		NodeName:    "node-1",
		NodeIP:      nodeIP,
		ExternalIP:  externalIP,
		PodCIDR:     podCIDR,
		NodePodCIDR: nodePodCIDR,
		ServiceCIDR: serviceCIDR,
		WorkDir:     cfg.WorkDir,
		logf:        cfg.Logf,
		pods:        map[string]*Pod{},
		nextPod:     2,
	}
	if c.logf == nil {
		c.logf = func(string, ...any) {}
	}
	c.NodeNS = c.Prefix + "-node"
	c.ExternalNS = c.Prefix + "-ext"
	if c.WorkDir == "" {
		if c.WorkDir, err = os.MkdirTemp("", "nftproxy-e2e-"); err != nil {
			return nil, err
		}
		c.ownWorkDir = true
	} else if err := os.MkdirAll(c.WorkDir, 0o755); err != nil {
		return nil, err
	}
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
		etcd = "etcd"
	}
	if c.echoBin, err = BuildBinaries(ctx, filepath.Join(c.WorkDir, "bin")); err != nil {
		return nil, err
	}
	if err := c.setupNetwork(ctx); err != nil {
		return nil, fmt.Errorf("network setup: %w", err)
	}
	if err := c.startControlPlane(ctx, etcd, apiserver); err != nil {
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
	for _, bin := range []string{"ip", "sysctl", "etcd", "go"} {
		if _, err := exec.LookPath(bin); err != nil {
			missing = append(missing, bin+" on PATH")
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("e2e prerequisites missing: %s", strings.Join(missing, ", "))
	}
	return nil
}

// setupNetwork creates the node and external namespaces and the link between them.
func (c *Cluster) setupNetwork(ctx context.Context) error {
	for _, ns := range []string{c.NodeNS, c.ExternalNS} {
		if err := c.addNetns(ctx, ns); err != nil {
			return err
		}
	}
	for _, kv := range []string{"net.ipv4.ip_forward=1", "net.ipv4.icmp_ratelimit=0"} {
		if out, err := c.Exec(ctx, c.NodeNS, "sysctl", "-qw", kv); err != nil {
			return fmt.Errorf("sysctl %s: %w: %s", kv, err, out)
		}
	}
	extIf := c.Prefix + "ext" // node side of the link to the external client
	if err := c.ip(ctx, c.NodeNS,
		fmt.Sprintf("link add %s type veth peer name eth0 netns %s", extIf, c.ExternalNS),
		fmt.Sprintf("addr add %s/%d dev %s", c.NodeIP, linkNet, extIf),
		"link set "+extIf+" up",
	); err != nil {
		return err
	}
	return c.ip(ctx, c.ExternalNS,
		fmt.Sprintf("addr add %s/%d dev eth0", c.ExternalIP, linkNet),
		"link set eth0 up",
		fmt.Sprintf("route add %s via %s", c.ServiceCIDR, c.NodeIP),
		fmt.Sprintf("route add %s via %s", c.PodCIDR, c.NodeIP),
	)
}

func (c *Cluster) addNetns(ctx context.Context, ns string) error {
	if out, err := exec.CommandContext(ctx, "ip", "netns", "add", ns).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns add %s: %w: %s", ns, err, out)
	}
	c.mu.Lock()
	c.netns = append(c.netns, ns)
	c.mu.Unlock()
	return c.ip(ctx, ns, "link set lo up")
}

func (c *Cluster) delNetns(ns string) error {
	if out, err := exec.Command("ip", "netns", "delete", ns).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns delete %s: %w: %s", ns, err, out)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, n := range c.netns {
		if n == ns {
			c.netns = append(c.netns[:i], c.netns[i+1:]...)
			break
		}
	}
	return nil
}

// ip runs `ip -n ns -batch -` with the given commands, stopping at the first failure.
func (c *Cluster) ip(ctx context.Context, ns string, cmds ...string) error {
	cmd := exec.CommandContext(ctx, "ip", "-n", ns, "-batch", "-")
	cmd.Stdin = strings.NewReader(strings.Join(cmds, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ip -n %s: %w: %s\ncommands:\n%s", ns, err, out, strings.Join(cmds, "\n"))
	}
	return nil
}

// Stop kills every process started through the cluster, deletes its namespaces and
// removes the work directory if Start created it (unless KEEP_E2E_WORKDIR=1).
// It is safe to call more than once.
func (c *Cluster) Stop() {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return
	}
	c.stopped = true
	procs := append([]*Process(nil), c.procs...)
	c.mu.Unlock()

	// Reverse start order: workloads and nftproxy first, etcd last.
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].Stop()
	}

	c.mu.Lock()
	nss := append([]string(nil), c.netns...)
	c.mu.Unlock()
	var errs []error
	for i := len(nss) - 1; i >= 0; i-- {
		errs = append(errs, c.delNetns(nss[i]))
	}
	if err := errors.Join(errs...); err != nil {
		c.logf("cluster %s: stop: %v", c.Prefix, err)
	}
	switch {
	case os.Getenv("KEEP_E2E_WORKDIR") == "1":
		c.logf("cluster %s: keeping workdir %s", c.Prefix, c.WorkDir)
	case c.ownWorkDir:
		if err := os.RemoveAll(c.WorkDir); err != nil {
			c.logf("cluster %s: remove workdir: %v", c.Prefix, err)
		}
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}
