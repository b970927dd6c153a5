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

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
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

	logf       func(format string, args ...any)
	ownWorkDir bool
	adminToken string
	images     map[string]string

	mu      sync.Mutex
	procs   []*Process
	netns   []string
	stopped bool
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
	c := &Cluster{Prefix: "rc" + randHex(3), logf: cfg.Logf, WorkDir: cfg.WorkDir}
	if c.logf == nil {
		c.logf = func(string, ...any) {}
	}
	c.CPNS = c.Prefix + "-cp"
	if c.WorkDir == "" {
		if c.WorkDir, err = os.MkdirTemp("", "nftproxy-rc-"); err != nil {
			return nil, err
		}
		c.ownWorkDir = true
	}
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
	c.logf("realcluster %s: binaries and images ready after %v; workdir %s", c.Prefix, time.Since(t0).Round(time.Second), c.WorkDir)
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
	c.logf("realcluster %s: %d nodes registered after %v", c.Prefix, len(c.Nodes), time.Since(t0).Round(time.Second))
	return c, nil
}

// CheckPrerequisites reports what is missing (root, containerd, runc, CNI plugins, ...).
func CheckPrerequisites() error {
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	for _, bin := range []string{"ip", "etcd", "go", "containerd", "containerd-shim-runc-v2", "runc", "ctr", "unshare", "nsenter", "nft"} {
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

func (c *Cluster) addNetns(ctx context.Context, ns string) error {
	if _, err := run(ctx, "ip", "netns", "add", ns); err != nil {
		return err
	}
	c.mu.Lock()
	c.netns = append(c.netns, ns)
	c.mu.Unlock()
	return c.ip(ctx, ns, "link set lo up")
}

func (c *Cluster) ip(ctx context.Context, ns string, cmds ...string) error {
	cmd := exec.CommandContext(ctx, "ip", "-n", ns, "-batch", "-")
	cmd.Stdin = strings.NewReader(strings.Join(cmds, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ip -n %s: %w: %s\ncommands:\n%s", ns, err, out, strings.Join(cmds, "\n"))
	}
	return nil
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
	etcd, err := c.start("etcd", inNetns(c.CPNS, "etcd",
		"--name=default", "--data-dir="+filepath.Join(c.WorkDir, "etcd"),
		"--listen-client-urls=http://127.0.0.1:2379", "--advertise-client-urls=http://127.0.0.1:2379",
		"--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=default=http://127.0.0.1:2380", "--listen-metrics-urls=http://127.0.0.1:2381",
		"--unsafe-no-fsync"))
	if err != nil {
		return err
	}
	apiserver, err := c.start("kube-apiserver", inNetns(c.CPNS, c.Bins.APIServer,
		"--advertise-address="+APIAddr,
		"--bind-address=0.0.0.0",
		fmt.Sprintf("--secure-port=%d", APIPort),
		"--etcd-servers=http://127.0.0.1:2379",
		"--service-cluster-ip-range="+ServiceCIDR,
		"--authorization-mode=Node,RBAC",
		"--allow-privileged=true",
		"--token-auth-file="+filepath.Join(pki, "tokens.csv"),
		"--client-ca-file="+filepath.Join(pki, "ca.crt"),
		"--tls-cert-file="+filepath.Join(pki, "apiserver.crt"),
		"--tls-private-key-file="+filepath.Join(pki, "apiserver.key"),
		"--service-account-key-file="+filepath.Join(pki, "sa.key"),
		"--service-account-signing-key-file="+filepath.Join(pki, "sa.key"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--kubelet-preferred-address-types=InternalIP",
		"--enable-admission-plugins=NodeRestriction",
	))
	if err != nil {
		return err
	}
	cfg := &rest.Config{
		Host:            APIServerURL,
		BearerToken:     c.adminToken,
		TLSClientConfig: rest.TLSClientConfig{CAFile: filepath.Join(pki, "ca.crt")},
		Dial:            nsDial(c.CPNS),
		QPS:             50,
		Burst:           100,
		Timeout:         30 * time.Second,
	}
	if c.Client, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := c.waitFor(wctx, "kube-apiserver /readyz", []*Process{etcd, apiserver}, func(ctx context.Context) error {
		_, err := c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err
	}); err != nil {
		return err
	}
	if err := c.waitFor(wctx, "namespace default", []*Process{apiserver}, func(ctx context.Context) error {
		_, err := c.Client.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
		return err
	}); err != nil {
		return err
	}
	if _, err := c.start("kube-controller-manager", inNetns(c.CPNS, c.Bins.ControllerManager,
		"--kubeconfig="+c.Kubeconfig,
		"--authentication-kubeconfig="+c.Kubeconfig,
		"--authorization-kubeconfig="+c.Kubeconfig,
		"--bind-address=127.0.0.1",
		"--leader-elect=false",
		"--use-service-account-credentials=true",
		"--service-account-private-key-file="+filepath.Join(pki, "sa.key"),
		"--root-ca-file="+filepath.Join(pki, "ca.crt"),
		"--cluster-signing-cert-file="+filepath.Join(pki, "ca.crt"),
		"--cluster-signing-key-file="+filepath.Join(pki, "ca.key"),
		"--allocate-node-cidrs=false",
		"--controllers=*,-nodeipam",
	)); err != nil {
		return err
	}
	if _, err := c.start("kube-scheduler", inNetns(c.CPNS, c.Bins.Scheduler,
		"--kubeconfig="+c.Kubeconfig,
		"--authentication-kubeconfig="+c.Kubeconfig,
		"--authorization-kubeconfig="+c.Kubeconfig,
		"--bind-address=127.0.0.1",
		"--leader-elect=false",
	)); err != nil {
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
	return os.WriteFile(path, []byte(kubeconfig(APIServerURL, ca, user, token)), 0o600)
}

func kubeconfig(server string, ca []byte, user, token string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: realcluster
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: %s
  user:
    token: %s
contexts:
- name: realcluster
  context:
    cluster: realcluster
    user: %[3]s
current-context: realcluster
`, server, b64(ca), user, token)
}

// waitFor polls check every 500 ms until it succeeds, ctx ends or one of procs exits.
func (c *Cluster) waitFor(ctx context.Context, what string, procs []*Process, check func(context.Context) error) error {
	start := time.Now()
	for {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := check(actx)
		cancel()
		if err == nil {
			c.logf("realcluster %s: %s after %v", c.Prefix, what, time.Since(start).Round(time.Millisecond))
			return nil
		}
		for _, p := range procs {
			if !p.Running() {
				return fmt.Errorf("waiting for %s: %s exited:\n%s", what, p.Name, p.Tail(20))
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last error: %v)", what, ctx.Err(), err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Kubectl runs kubectl with the admin kubeconfig inside the control-plane namespace.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	return run(ctx, inNetns(c.CPNS, append([]string{c.Bins.Kubectl, "--kubeconfig=" + c.Kubeconfig}, args...)...)...)
}

// KubectlInput is Kubectl with stdin (e.g. `apply -f -`).
func (c *Cluster) KubectlInput(ctx context.Context, stdin string, args ...string) (string, error) {
	argv := inNetns(c.CPNS, append([]string{c.Bins.Kubectl, "--kubeconfig=" + c.Kubeconfig}, args...)...)
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
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return
	}
	c.stopped = true
	procs := append([]*Process(nil), c.procs...)
	nodes := append([]*Node(nil), c.Nodes...)
	c.mu.Unlock()
	var errs []error
	for _, n := range nodes {
		errs = append(errs, n.teardown())
	}
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].Stop(3 * time.Second)
	}
	c.mu.Lock()
	nss := append([]string(nil), c.netns...)
	c.mu.Unlock()
	for i := len(nss) - 1; i >= 0; i-- {
		if out, err := exec.Command("ip", "netns", "delete", nss[i]).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ip netns delete %s: %w: %s", nss[i], err, out))
		}
	}
	if err := errors.Join(errs...); err != nil {
		c.logf("realcluster %s: stop: %v", c.Prefix, err)
	}
	switch {
	case os.Getenv("KEEP_E2E_WORKDIR") == "1":
		c.logf("realcluster %s: keeping workdir %s", c.Prefix, c.WorkDir)
	case c.ownWorkDir:
		if err := os.RemoveAll(c.WorkDir); err != nil {
			c.logf("realcluster %s: remove workdir: %v", c.Prefix, err)
		}
	}
}

// Tails returns the last n lines of every process log (for a failed test).
func (c *Cluster) Tails(n int) string {
	c.mu.Lock()
	procs := append([]*Process(nil), c.procs...)
	c.mu.Unlock()
	var b strings.Builder
	for _, p := range procs {
		fmt.Fprintf(&b, "--- tail of %s:\n%s\n", p.Log, p.Tail(n))
	}
	return b.String()
}

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
