package cluster

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/vishvananda/netns"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

const (
	apiserverPort  = 6443
	startupTimeout = 90 * time.Second
)

// buildAPIServer runs e2e/hack/build-k8s.sh, which prints the cached binary's path.
func buildAPIServer(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, filepath.Join(e2eDir(), "hack", "build-k8s.sh"), "kube-apiserver").Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		return "", fmt.Errorf("build-k8s.sh: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// EtcdEnv names an etcd binary to run instead of the one e2e/hack/build-etcd.sh builds
// (e.g. Debian's /usr/bin/etcd, 3.4.23, too old for the API server's watch-list path).
const EtcdEnv = "NFTPROXY_ETCD"

// EtcdBinary is the etcd the control plane runs: $NFTPROXY_ETCD if set, otherwise the
// release kubeadm v1.37.0 deploys, built and cached by e2e/hack/build-etcd.sh (which
// honours ETCD_VERSION) and printed by it.
func EtcdBinary(ctx context.Context) (string, error) {
	if p := os.Getenv(EtcdEnv); p != "" {
		return p, nil
	}
	out, err := exec.CommandContext(ctx, filepath.Join(e2eDir(), "hack", "build-etcd.sh")).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		return "", fmt.Errorf("build-etcd.sh: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// EtcdVersion is what bin --version reports as its version ("3.7.0").
func EtcdVersion(ctx context.Context, bin string) (string, error) {
	out, err := exec.CommandContext(ctx, bin, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", bin, err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(l, "etcd Version: "); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("%s --version: no version in %q", bin, out)
}

// e2eDir is the e2e/ directory of the source tree (this file is e2e/cluster/*.go).
func e2eDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

func (c *Cluster) startControlPlane(ctx context.Context, etcdBin, apiserverBin string, cfg Config) error {
	pki := filepath.Join(c.WorkDir, "pki")
	if err := os.MkdirAll(pki, 0o700); err != nil {
		return err
	}
	saKey := filepath.Join(pki, "sa.key")
	if err := writeRSAKey(saKey); err != nil {
		return err
	}
	token := randHex(16)
	tokenFile := filepath.Join(pki, "tokens.csv")
	if err := os.WriteFile(tokenFile, []byte(token+`,admin,admin,"system:masters"`+"\n"), 0o600); err != nil {
		return err
	}
	cs, err := StartControlPlane(ctx, c.h, ControlPlane{
		NS:               c.NodeNS,
		Etcd:             etcdBin,
		EtcdDataDir:      cfg.EtcdDataDir,
		APIServer:        apiserverBin,
		AdvertiseAddress: c.NodeIP.String(),
		ServiceCIDRs:     c.ServiceCIDR.String() + "," + c.ServiceCIDRv6.String(),
		TokenFile:        tokenFile,
		Token:            token,
		SAKeyFile:        saKey,
		APIServerArgs: append([]string{
			"--endpoint-reconciler-type=none",
			"--cert-dir=" + pki, // a self-signed serving certificate
			"--service-account-issuer=https://kubernetes.default.svc",
		}, cfg.APIServerArgs...),
		QPS: 100, Burst: 200,
		Timeout: startupTimeout,
	})
	if err != nil {
		return err
	}
	c.Client = cs
	c.Kubeconfig = filepath.Join(c.WorkDir, "kubeconfig")
	if err := os.WriteFile(c.Kubeconfig, []byte(Kubeconfig(c.apiserverURL(), nil, "admin", token)), 0o600); err != nil {
		return err
	}
	return c.registerNode(ctx, c.nodes[0])
}

// apiserverURL is where processes in any node namespace reach kube-apiserver.
func (c *Cluster) apiserverURL() string {
	return fmt.Sprintf("https://%s", net.JoinHostPort(c.NodeIP.String(), fmt.Sprint(apiserverPort)))
}

// ControlPlane says how StartControlPlane runs etcd and kube-apiserver.
type ControlPlane struct {
	NS          string // network namespace both run in
	Etcd        string // etcd binary
	EtcdDataDir string // default WorkDir/etcd
	EtcdArgs    []string
	APIServer   string // kube-apiserver binary
	// AdvertiseAddress is the apiserver's address in NS; it listens on every address,
	// port 6443.
	AdvertiseAddress string
	ServiceCIDRs     string // --service-cluster-ip-range
	TokenFile        string // --token-auth-file; holds Token for a system:masters user
	Token            string
	SAKeyFile        string // service-account signing key
	// CAFile verifies the apiserver's serving certificate (APIServerArgs name it); empty:
	// the client does not verify it.
	CAFile        string
	APIServerArgs []string // appended after the common flags
	QPS           float32  // of the returned client
	Burst         int
	Timeout       time.Duration // for /readyz and namespace default
}

// StartControlPlane starts etcd and kube-apiserver in cp.NS as h's processes "etcd" and
// "kube-apiserver", and returns an admin client for the test process (dialling from
// cp.NS) once /readyz answers and namespace default exists.
func StartControlPlane(ctx context.Context, h *Harness, cp ControlPlane) (kubernetes.Interface, error) {
	dataDir := cp.EtcdDataDir
	if dataDir == "" {
		dataDir = filepath.Join(h.WorkDir, "etcd")
	}
	etcd, err := h.Start("etcd", nil, InNetns(cp.NS, append([]string{cp.Etcd,
		"--name=default",
		"--data-dir=" + dataDir,
		"--listen-client-urls=http://127.0.0.1:2379",
		"--advertise-client-urls=http://127.0.0.1:2379",
		"--listen-peer-urls=http://127.0.0.1:2380",
		"--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=default=http://127.0.0.1:2380",
		"--listen-metrics-urls=http://127.0.0.1:2381",
	}, cp.EtcdArgs...)...)...)
	if err != nil {
		return nil, err
	}
	apiserver, err := h.Start("kube-apiserver", nil, InNetns(cp.NS, append([]string{cp.APIServer,
		"--advertise-address=" + cp.AdvertiseAddress,
		"--bind-address=0.0.0.0",
		fmt.Sprintf("--secure-port=%d", apiserverPort),
		"--etcd-servers=http://127.0.0.1:2379",
		"--service-cluster-ip-range=" + cp.ServiceCIDRs,
		"--authorization-mode=Node,RBAC",
		"--token-auth-file=" + cp.TokenFile,
		"--service-account-key-file=" + cp.SAKeyFile,
		"--service-account-signing-key-file=" + cp.SAKeyFile,
	}, cp.APIServerArgs...)...)...)
	if err != nil {
		return nil, err
	}
	tls := rest.TLSClientConfig{CAFile: cp.CAFile, Insecure: cp.CAFile == ""}
	cs, err := kubernetes.NewForConfig(&rest.Config{
		Host:            fmt.Sprintf("https://%s", net.JoinHostPort(cp.AdvertiseAddress, fmt.Sprint(apiserverPort))),
		BearerToken:     cp.Token,
		TLSClientConfig: tls,
		Dial:            NSDialer(cp.NS),
		QPS:             cp.QPS,
		Burst:           cp.Burst,
		Timeout:         30 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cp.Timeout)
	defer cancel()
	if err := h.WaitFor(ctx, "kube-apiserver /readyz", []*Process{etcd, apiserver}, func(ctx context.Context) error {
		_, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err
	}); err != nil {
		return nil, err
	}
	if err := h.WaitFor(ctx, "namespace default", []*Process{apiserver}, func(ctx context.Context) error {
		_, err := cs.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
		return err
	}); err != nil {
		return nil, err
	}
	return cs, nil
}

func writeRSAKey(path string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	der := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	return os.WriteFile(path, der, 0o600)
}

// Kubeconfig is a kubeconfig for user with a bearer token; without ca the server's
// certificate is not verified.
func Kubeconfig(server string, ca []byte, user, token string) string {
	trust := "insecure-skip-tls-verify: true"
	if ca != nil {
		trust = "certificate-authority-data: " + base64.StdEncoding.EncodeToString(ca)
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: %s
    %s
users:
- name: %s
  user:
    token: %s
contexts:
- name: e2e
  context:
    cluster: e2e
    user: %[3]s
current-context: e2e
`, server, trust, user, token)
}

// NSDialer dials from inside the named network namespace: the socket is created on a
// locked OS thread switched into the namespace, so no root-namespace route is needed.
func NSDialer(nsName string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		type result struct {
			conn net.Conn
			err  error
		}
		ch := make(chan result, 1)
		go func() {
			runtime.LockOSThread()
			conn, restored, err := dialInNetns(ctx, nsName, network, addr)
			if restored {
				runtime.UnlockOSThread()
			} // else: the goroutine exits locked and the runtime discards the thread
			ch <- result{conn, err}
		}()
		r := <-ch
		return r.conn, r.err
	}
}

// dialInNetns must run on a locked OS thread. restored reports whether the thread is
// back in its original namespace.
func dialInNetns(ctx context.Context, nsName, network, addr string) (conn net.Conn, restored bool, err error) {
	orig, err := netns.Get()
	if err != nil {
		return nil, true, err
	}
	defer orig.Close()
	target, err := netns.GetFromName(nsName)
	if err != nil {
		return nil, true, err
	}
	defer target.Close()
	if err := netns.Set(target); err != nil {
		return nil, false, err
	}
	var d net.Dialer
	conn, err = d.DialContext(ctx, network, addr)
	if rerr := netns.Set(orig); rerr != nil {
		if conn != nil {
			conn.Close()
		}
		return nil, false, fmt.Errorf("restore netns: %w", rerr)
	}
	return conn, true, err
}
