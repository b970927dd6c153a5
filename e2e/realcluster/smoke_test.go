package realcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nftproxy/nftproxy/e2e/cluster"
)

// Proxy names accepted by installProxy.
const (
	proxyNftproxy  = "nftproxy"
	proxyKubeProxy = "kube-proxy"
)

// startWithProxy starts a two-node cluster with the nftproxy release imported (its
// image tarball from `make release` of this tree, as an operator would load it) and
// returns the cluster and the release's linux/amd64 binary.
func startWithProxy(t *testing.T, proxy string) (*Cluster, string) {
	t.Helper()
	Require(t)
	ctx := t.Context()
	dir := t.TempDir()
	t0 := time.Now()
	tarball, bin, err := ReleaseImage(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("release built: %s (%v)", filepath.Base(tarball), time.Since(t0).Round(time.Second))
	c := StartT(t, Config{Images: map[string]string{NftproxyImageRef: tarball}})
	if err := c.WaitNodesReady(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster up, nodes Ready: %v", time.Since(t0).Round(time.Second))
	return c, bin
}

func installProxy(ctx context.Context, c *Cluster, proxy string) error {
	switch proxy {
	case proxyNftproxy:
		return c.InstallNftproxyChart(ctx, "")
	case proxyKubeProxy:
		return c.InstallKubeProxy(ctx)
	}
	return fmt.Errorf("unknown proxy %q", proxy)
}

// TestRealClusterSmoke is the CI smoke of the real cluster: two kubelet nodes, a
// Deployment + NodePort Service on node-1, a client pod on node-2. Without a proxy the
// ClusterIP times out; after `helm install` of charts/nftproxy (nftproxy as a DaemonSet,
// the image built from this tree under the chart's image reference) the ClusterIP and
// the node port of both nodes answer from the backend, `nftproxy verify` finds each
// node's tables equal to what the API compiles to, the metrics Service's endpoints are
// scraped as Prometheus would (and every series the dashboard and the alert rules use
// is among what the proxies serve), and one [Conformance] Services spec of upstream's
// e2e.test passes.
func TestRealClusterSmoke(t *testing.T) {
	proxy := proxyNftproxy
	if p := os.Getenv("REALCLUSTER_PROXY"); p != "" { // kube-proxy: the same checks against the baseline
		proxy = p
	}
	t0 := time.Now()
	c, bin := startWithProxy(t, proxy)
	ctx := t.Context()

	svc, err := c.WebApp(ctx, "default", "web", 1, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.ClientPod(ctx, "default", "client", "node-2"); err != nil {
		t.Fatal(err)
	}
	clusterIP := svc.Spec.ClusterIP + ":80"
	nodePort := svc.Spec.Ports[0].NodePort
	if got := c.ConnectFrom(ctx, "default", "client", clusterIP, 3*time.Second); got != "TIMEOUT" {
		t.Fatalf("before any proxy: connect to ClusterIP %s = %q, want TIMEOUT (something else proxies services?)", clusterIP, got)
	}
	t.Logf("before any proxy: ClusterIP %s times out", clusterIP)

	tp := time.Now()
	if err := installProxy(ctx, c, proxy); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s DaemonSet ready on both nodes %v after install", proxy, time.Since(tp).Round(time.Millisecond))

	targets := []string{clusterIP, fmt.Sprintf("%s:%d", NodeIP(1), nodePort), fmt.Sprintf("%s:%d", NodeIP(2), nodePort)}
	for _, addr := range targets {
		var got string
		var err error
		deadline := time.Now().Add(30 * time.Second)
		for {
			got, err = c.HTTPFrom(ctx, "default", "client", addr, "/hostname", 3*time.Second)
			if err == nil && strings.HasPrefix(got, "web-") || time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Second)
		}
		if err != nil || !strings.HasPrefix(got, "web-") {
			t.Errorf("client on node-2 -> %s: %q, %v; want the web pod's name", addr, got, err)
		} else {
			t.Logf("client on node-2 -> %s: answered by %s", addr, got)
		}
	}

	for _, n := range c.Nodes {
		out, err := run(ctx, cluster.InNetns(n.NS, "nft", "list", "tables")...)
		if err != nil {
			t.Fatal(err)
		}
		want := "table ip nftproxy"
		if proxy == proxyKubeProxy {
			want = "table ip kube-proxy"
		}
		if !strings.Contains(out, want) {
			t.Errorf("%s: nft list tables has no %q:\n%s", n.Name, want, out)
		}
		if proxy == proxyNftproxy {
			if out, err := c.Verify(ctx, n, bin); err != nil {
				t.Errorf("%s: nftproxy verify: %v\n%s", n.Name, err, out)
			} else {
				t.Logf("%s: nftproxy verify: kernel matches the API", n.Name)
			}
		}
	}

	if proxy == proxyNftproxy {
		checkMetricsService(t, c)
	}

	if os.Getenv("REALCLUSTER_SKIP_E2E") != "1" {
		e2eBin, err := E2ETest(ctx)
		if err != nil {
			t.Fatal(err)
		}
		spec := `\[sig-network\] Services should serve a basic endpoint from pods \[Conformance\]`
		res, err := c.RunE2E(ctx, e2eBin, filepath.Join(c.WorkDir, "e2e"), spec, "", 10*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if len(res) != 1 || res[0].State != "passed" {
			t.Fatalf("e2e.test %q: %+v", spec, res)
		}
		t.Logf("e2e.test: %s passed in %.0fs", res[0].Name, res[0].Seconds)
	}
	t.Logf("smoke wall time (build, cluster, proxy, checks, e2e spec): %v", time.Since(t0).Round(time.Second))
	_ = corev1.ProtocolTCP
}
