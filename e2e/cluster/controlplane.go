package cluster

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
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

	etcdData := cfg.EtcdDataDir
	if etcdData == "" {
		etcdData = filepath.Join(c.WorkDir, "etcd")
	}
	etcd, err := c.StartProcess(c.NodeNS, "etcd", etcdBin,
		"--name=default",
		"--data-dir="+etcdData,
		"--listen-client-urls=http://127.0.0.1:2379",
		"--advertise-client-urls=http://127.0.0.1:2379",
		"--listen-peer-urls=http://127.0.0.1:2380",
		"--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=default=http://127.0.0.1:2380",
		"--listen-metrics-urls=http://127.0.0.1:2381",
	)
	if err != nil {
		return err
	}
	apiserverArgs := []string{apiserverBin,
		"--advertise-address=" + c.NodeIP.String(),
		"--bind-address=0.0.0.0",
		fmt.Sprintf("--secure-port=%d", apiserverPort),
		"--etcd-servers=http://127.0.0.1:2379",
		"--service-cluster-ip-range=" + c.ServiceCIDR.String() + "," + c.ServiceCIDRv6.String(),
		"--endpoint-reconciler-type=none",
		"--authorization-mode=Node,RBAC",
		"--token-auth-file=" + tokenFile,
		"--cert-dir=" + pki,
		"--service-account-key-file=" + saKey,
		"--service-account-signing-key-file=" + saKey,
		"--service-account-issuer=https://kubernetes.default.svc",
	}
	apiserver, err := c.StartProcess(c.NodeNS, "kube-apiserver", append(apiserverArgs, cfg.APIServerArgs...)...)
	if err != nil {
		return err
	}

	server := fmt.Sprintf("https://%s", net.JoinHostPort(c.NodeIP.String(), fmt.Sprint(apiserverPort)))
	c.Kubeconfig = filepath.Join(c.WorkDir, "kubeconfig")
	if err := os.WriteFile(c.Kubeconfig, []byte(kubeconfig(server, "admin", token)), 0o600); err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(&rest.Config{
		Host:            server,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		Dial:            nsDialer(c.NodeNS),
		QPS:             100,
		Burst:           200,
		Timeout:         30 * time.Second,
	})
	if err != nil {
		return err
	}
	c.Client = cs

	ctx, cancel := context.WithTimeout(ctx, startupTimeout)
	defer cancel()
	if err := c.waitFor(ctx, "kube-apiserver /readyz", []*Process{etcd, apiserver}, func(ctx context.Context) error {
		_, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err
	}); err != nil {
		return err
	}
	if err := c.waitFor(ctx, "namespace default", []*Process{apiserver}, func(ctx context.Context) error {
		_, err := cs.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
		return err
	}); err != nil {
		return err
	}
	return c.registerNode(ctx, c.nodes[0])
}

// waitFor polls check until it succeeds, ctx expires or one of procs exits.
func (c *Cluster) waitFor(ctx context.Context, what string, procs []*Process, check func(context.Context) error) error {
	start := time.Now()
	for {
		attempt, cancel := context.WithTimeout(ctx, 3*time.Second)
		err := check(attempt)
		cancel()
		if err == nil {
			c.logf("cluster %s: %s after %v", c.Prefix, what, time.Since(start).Round(time.Millisecond))
			return nil
		}
		for _, p := range procs {
			if !p.Running() {
				return fmt.Errorf("waiting for %s: %s exited; log %s:\n%s", what, filepath.Base(p.Log), p.Log, p.Tail(20))
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last error: %v)", what, ctx.Err(), err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func writeRSAKey(path string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	der := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	return os.WriteFile(path, der, 0o600)
}

// kubeconfig is a kubeconfig for user with a bearer token.
func kubeconfig(server, user, token string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: %s
    insecure-skip-tls-verify: true
users:
- name: %[2]s
  user:
    token: %[3]s
contexts:
- name: e2e
  context:
    cluster: e2e
    user: %[2]s
current-context: e2e
`, server, user, token)
}

// nsDialer dials from inside the named network namespace: the socket is created on a
// locked OS thread switched into the namespace, so no root-namespace route is needed.
func nsDialer(nsName string) func(ctx context.Context, network, addr string) (net.Conn, error) {
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
