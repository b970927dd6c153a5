package realcluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/nftproxy/nftproxy/e2e/cluster"
)

// Fixed addressing (documentation and private ranges, inside the cluster's namespaces only).
const (
	APIAddr      = "192.0.2.1" // the control-plane namespace on the LAN bridge
	APIPort      = 6443
	ServiceCIDR  = "10.96.0.0/16"
	ClusterCIDR  = "10.244.0.0/16"
	DNSServiceIP = "10.96.0.10"
	lanPrefix    = 24
)

// APIServerURL is the address nodes and pods reach kube-apiserver at.
var APIServerURL = fmt.Sprintf("https://%s:%d", APIAddr, APIPort)

// NodeIP is node N's (1-based) InternalIP; its pods get 10.244.N.0/24.
func NodeIP(n int) string         { return fmt.Sprintf("192.0.2.%d", 10+n) }
func nodePodCIDR(n int) string    { return fmt.Sprintf("10.244.%d.0/24", n) }
func nodePodGateway(n int) string { return fmt.Sprintf("10.244.%d.1", n) }

// Config configures Start. All fields are optional.
type Config struct {
	Nodes   int    // number of kubelet nodes; default 2
	WorkDir string // default: a new directory under /tmp
	Logf    func(format string, args ...any)
	// Images are extra OCI image tarballs (ref -> path) imported into every node besides
	// the base images of e2e/hack/build-images.sh.
	Images map[string]string
}

// Cluster is a running real cluster. Stop tears it down.
type Cluster struct {
	Prefix     string
	CPNS       string // control-plane netns: LAN bridge, etcd, kube-apiserver, kcm, scheduler
	WorkDir    string
	Kubeconfig string // admin kubeconfig (server APIServerURL), usable in any cluster netns
	Client     kubernetes.Interface
	Nodes      []*Node
	Bins       Binaries

	h          *cluster.Harness // processes, namespaces and the work directory
	adminToken string
	images     map[string]string

	mu sync.Mutex // guards Nodes
}

// Binaries are the Kubernetes binaries from e2e/hack/build-k8s.sh.
type Binaries struct {
	APIServer, ControllerManager, Scheduler, Kubelet, Kubectl string
}

// Start builds (or finds cached) binaries and images, creates the namespaces and starts
// the control plane and every node, and returns once all nodes are registered. CoreDNS is
// deployed but, with no service proxy yet, cannot reach the API: install one.
func Start(ctx context.Context, cfg Config) (_ *Cluster, err error) {
	if cfg.Nodes == 0 {
		cfg.Nodes = 2
	}
	if err := CheckPrerequisites(); err != nil {
		return nil, err
	}
	h, err := cluster.NewHarness("realcluster", "rc"+randHex(3), cfg.WorkDir, "nftproxy-rc-", cfg.Logf)
	if err != nil {
		return nil, err
	}
	h.AttemptTimeout = 5 * time.Second
	c := &Cluster{h: h, Prefix: h.Prefix, WorkDir: h.WorkDir}
	c.CPNS = c.Prefix + "-cp"
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	t0 := time.Now()
	if c.Bins, err = buildK8s(ctx); err != nil {
		return nil, err
	}
	if c.images, err = baseImages(ctx); err != nil {
		return nil, err
	}
	for ref, path := range cfg.Images {
		c.images[ref] = path
	}
	c.h.Logf("binaries and images ready after %v; workdir %s", time.Since(t0).Round(time.Second), c.WorkDir)
	if err := c.setupLAN(ctx); err != nil {
		return nil, err
	}
	if err := c.startControlPlane(ctx); err != nil {
		return nil, fmt.Errorf("control plane: %w", err)
	}
	for i := 1; i <= cfg.Nodes; i++ {
		n, err := c.addNode(ctx, i)
		if err != nil {
			return nil, fmt.Errorf("node-%d: %w", i, err)
		}
		c.Nodes = append(c.Nodes, n)
	}
	for _, n := range c.Nodes {
		if err := c.waitNodeRegistered(ctx, n); err != nil {
			return nil, err
		}
	}
	if err := c.deployCoreDNS(ctx); err != nil {
		return nil, fmt.Errorf("coredns: %w", err)
	}
	c.h.Logf("%d nodes registered after %v", len(c.Nodes), time.Since(t0).Round(time.Second))
	return c, nil
}

// CheckPrerequisites reports what is missing (root, containerd, runc, CNI plugins, ...).
func CheckPrerequisites() error {
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	for _, bin := range []string{"ip", "go", "containerd", "containerd-shim-runc-v2", "runc", "ctr", "unshare", "nsenter", "nft"} {
		if _, err := exec.LookPath(bin); err != nil {
			missing = append(missing, bin)
		}
	}
	for _, p := range []string{"bridge", "host-local", "portmap", "loopback"} {
		if _, err := os.Stat(filepath.Join(cniBinDir, p)); err != nil {
			missing = append(missing, cniBinDir+"/"+p+" (containernetworking-plugins)")
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("real-cluster prerequisites missing: %s (apt-get install containerd runc containernetworking-plugins)", strings.Join(missing, ", "))
	}
	return nil
}

// setupLAN creates the control-plane namespace holding the LAN bridge the nodes join.
func (c *Cluster) setupLAN(ctx context.Context) error {
	if err := c.addNetns(ctx, c.CPNS); err != nil {
		return err
	}
	return c.ip(ctx, c.CPNS,
		"link add br0 type bridge",
		fmt.Sprintf("addr add %s/%d dev br0", APIAddr, lanPrefix),
		"link set br0 up",
	)
}

func (c *Cluster) addNetns(ctx context.Context, ns string) error { return c.h.AddNetns(ctx, ns) }

func (c *Cluster) ip(ctx context.Context, ns string, cmds ...string) error {
	return c.h.IP(ctx, ns, cmds...)
}

func (c *Cluster) startControlPlane(ctx context.Context) error {
	pki := filepath.Join(c.WorkDir, "pki")
	sans := []net.IP{net.ParseIP(APIAddr), net.ParseIP("10.96.0.1"), net.ParseIP("127.0.0.1")}
	names := []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost"}
	if err := writePKI(pki, sans, names); err != nil {
		return err
	}
	c.adminToken = randHex(16)
	var tokens strings.Builder
	fmt.Fprintf(&tokens, "%s,admin,admin,\"system:masters\"\n", c.adminToken)
	for i := 1; i <= 9; i++ { // kubelets authenticate as system:node:node-N (Node authorizer)
		fmt.Fprintf(&tokens, "%s,system:node:node-%d,node-%d,\"system:nodes\"\n", nodeToken(c.adminToken, i), i, i)
	}
	if err := os.WriteFile(filepath.Join(pki, "tokens.csv"), []byte(tokens.String()), 0o600); err != nil {
		return err
	}
	c.Kubeconfig = filepath.Join(c.WorkDir, "kubeconfig")
	if err := c.writeKubeconfig(c.Kubeconfig, "admin", c.adminToken); err != nil {
		return err
	}
	etcd, err := cluster.EtcdBinary(ctx)
	if err != nil {
		return err
	}
	c.Client, err = cluster.StartControlPlane(ctx, c.h, cluster.ControlPlane{
		NS:               c.CPNS,
		Etcd:             etcd,
		EtcdArgs:         []string{"--unsafe-no-fsync"},
		APIServer:        c.Bins.APIServer,
		AdvertiseAddress: APIAddr,
		ServiceCIDRs:     ServiceCIDR,
		TokenFile:        filepath.Join(pki, "tokens.csv"),
		Token:            c.adminToken,
		SAKeyFile:        filepath.Join(pki, "sa.key"),
		CAFile:           filepath.Join(pki, "ca.crt"),
		APIServerArgs: []string{
			"--allow-privileged=true",
			"--client-ca-file=" + filepath.Join(pki, "ca.crt"),
			"--tls-cert-file=" + filepath.Join(pki, "apiserver.crt"),
			"--tls-private-key-file=" + filepath.Join(pki, "apiserver.key"),
			"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
			"--kubelet-preferred-address-types=InternalIP",
			"--enable-admission-plugins=NodeRestriction",
		},
		QPS: 50, Burst: 100,
		Timeout: 2 * time.Minute,
	})
	if err != nil {
		return err
	}
	// Both run in the control-plane namespace with the admin kubeconfig, locally bound.
	common := []string{
		"--kubeconfig=" + c.Kubeconfig,
		"--authentication-kubeconfig=" + c.Kubeconfig,
		"--authorization-kubeconfig=" + c.Kubeconfig,
		"--bind-address=127.0.0.1",
		"--leader-elect=false",
	}
	if _, err := c.h.Start("kube-controller-manager", nil, cluster.InNetns(c.CPNS, append(append([]string{c.Bins.ControllerManager}, common...),
		"--use-service-account-credentials=true",
		"--service-account-private-key-file="+filepath.Join(pki, "sa.key"),
		"--root-ca-file="+filepath.Join(pki, "ca.crt"),
		"--cluster-signing-cert-file="+filepath.Join(pki, "ca.crt"),
		"--cluster-signing-key-file="+filepath.Join(pki, "ca.key"),
		"--allocate-node-cidrs=false",
		"--controllers=*,-nodeipam",
	)...)...); err != nil {
		return err
	}
	if _, err := c.h.Start("kube-scheduler", nil, cluster.InNetns(c.CPNS, append([]string{c.Bins.Scheduler}, common...)...)...); err != nil {
		return err
	}
	return nil
}

// nodeToken derives node N's bearer token from the admin token (one tokens.csv line each).
func nodeToken(admin string, n int) string { return fmt.Sprintf("%s-node%d", admin[:16], n) }

func (c *Cluster) writeKubeconfig(path, user, token string) error {
	ca, err := os.ReadFile(filepath.Join(c.WorkDir, "pki", "ca.crt"))
	if err != nil {
		return err
	}
	return os.WriteFile(path, []byte(cluster.Kubeconfig(APIServerURL, ca, user, token)), 0o600)
}

// Kubectl runs kubectl with the admin kubeconfig inside the control-plane namespace.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	return run(ctx, cluster.InNetns(c.CPNS, append([]string{c.Bins.Kubectl, "--kubeconfig=" + c.Kubeconfig}, args...)...)...)
}

// KubectlInput is Kubectl with stdin (e.g. `apply -f -`).
func (c *Cluster) KubectlInput(ctx context.Context, stdin string, args ...string) (string, error) {
	argv := cluster.InNetns(c.CPNS, append([]string{c.Bins.Kubectl, "--kubeconfig=" + c.Kubeconfig}, args...)...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Stop tears everything down: each node (kubelet, containerd, shims, containers, its
// mount namespace and cgroups), the control plane, the namespaces, and the work
// directory unless KEEP_E2E_WORKDIR=1. Safe to call more than once.
func (c *Cluster) Stop() {
	c.h.Stop(func() error {
		c.mu.Lock()
		nodes := append([]*Node(nil), c.Nodes...)
		c.mu.Unlock()
		var errs []error
		for _, n := range nodes {
			errs = append(errs, n.teardown())
		}
		return errors.Join(errs...)
	})
}

// Tails returns the last n lines of every process log (for a failed test).
func (c *Cluster) Tails(n int) string { return c.h.Tails(n) }

// e2eDir is the repository's e2e/ directory (this file is e2e/realcluster/cluster.go).
func e2eDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

func randHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}
