package realcluster

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/e2e/cluster"
)

// ChartDir is the repository's Helm chart, charts/nftproxy.
func ChartDir() string { return filepath.Join(filepath.Dir(e2eDir()), "charts", "nftproxy") }

// ChartImageRepository is the chart's default image.repository.
const ChartImageRepository = "ghcr.io/nftproxy/nftproxy"

// chartAppVersion reads appVersion from charts/nftproxy/Chart.yaml: the chart's default
// image tag.
func chartAppVersion() (string, error) {
	b, err := os.ReadFile(filepath.Join(ChartDir(), "Chart.yaml"))
	if err != nil {
		return "", err
	}
	m := regexp.MustCompile(`(?m)^appVersion:\s*"?([^"\s]+)"?\s*$`).FindSubmatch(b)
	if m == nil {
		return "", fmt.Errorf("charts/nftproxy/Chart.yaml has no appVersion")
	}
	return string(m[1]), nil
}

func chartImageRef() string {
	v, err := chartAppVersion()
	if err != nil {
		panic(err) // the repository is broken: no test here can run
	}
	return ChartImageRepository + ":" + v
}

// helmBinary returns bin/helm, built from the Go module proxy by
// e2e/hack/install-tools.sh (which this runs: it builds only what is missing).
func helmBinary(ctx context.Context) (string, error) {
	if _, err := scriptOutput(ctx, filepath.Join(e2eDir(), "hack", "install-tools.sh")); err != nil {
		return "", err
	}
	return filepath.Join(filepath.Dir(e2eDir()), "bin", "helm"), nil
}

// Helm runs helm with the admin kubeconfig inside the control-plane namespace, its
// cache, configuration and data in the work directory.
func (c *Cluster) Helm(ctx context.Context, args ...string) (string, error) {
	helm, err := helmBinary(ctx)
	if err != nil {
		return "", err
	}
	home := filepath.Join(c.WorkDir, "helm")
	argv := []string{"env", "HELM_CACHE_HOME=" + home + "/cache", "HELM_CONFIG_HOME=" + home + "/config",
		"HELM_DATA_HOME=" + home + "/data", helm, "--kubeconfig=" + c.Kubeconfig}
	return run(ctx, cluster.InNetns(c.CPNS, append(argv, args...)...)...)
}

// InstallNftproxyChart installs charts/nftproxy as release nftproxy in kube-system with
// `helm install`: the API server's address, the pod network and the image
// (ChartImageRepository:tag, tag "" for the chart's appVersion) through values, plus
// set (more name=value pairs), then waits until its DaemonSet is ready on every node.
func (c *Cluster) InstallNftproxyChart(ctx context.Context, tag string, set ...string) error {
	if tag == "" {
		v, err := chartAppVersion()
		if err != nil {
			return err
		}
		tag = v
	}
	args := []string{"install", "nftproxy", ChartDir(), "--namespace=kube-system",
		"--set=apiServer.host=" + APIAddr, "--set=apiServer.port=" + strconv.Itoa(APIPort),
		"--set=clusterCIDR=10.244.0.0/16",
		"--set=image.repository=" + ChartImageRepository, "--set=image.tag=" + tag}
	for _, s := range set {
		args = append(args, "--set="+s)
	}
	out, err := c.Helm(ctx, args...)
	if err != nil {
		return err
	}
	c.h.Logf("helm install:\n%s", strings.TrimSpace(out))
	return c.WaitDaemonSet(ctx, "kube-system", "nftproxy", 3*time.Minute)
}

// MetricsEndpoint is one address the metrics Service's EndpointSlices list.
type MetricsEndpoint struct {
	Node, Addr string // the node name, ip:port
}

// MetricsEndpoints lists the ready endpoints of Service ns/name (the chart's metrics
// Service, nftproxy-metrics) at its port "metrics", as Prometheus' endpoints discovery
// finds them.
func (c *Cluster) MetricsEndpoints(ctx context.Context, ns, name string) ([]MetricsEndpoint, error) {
	slices, err := c.Client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + name})
	if err != nil {
		return nil, err
	}
	var out []MetricsEndpoint
	for _, s := range slices.Items {
		var port int32
		for _, p := range s.Ports {
			if p.Name != nil && *p.Name == "metrics" && p.Port != nil {
				port = *p.Port
			}
		}
		if port == 0 {
			return nil, fmt.Errorf("EndpointSlice %s has no port named metrics: %+v", s.Name, s.Ports)
		}
		for _, e := range s.Endpoints {
			if e.Conditions.Ready == nil || !*e.Conditions.Ready || e.NodeName == nil {
				continue
			}
			for _, a := range e.Addresses {
				out = append(out, MetricsEndpoint{Node: *e.NodeName, Addr: net.JoinHostPort(a, strconv.Itoa(int(port)))})
			}
		}
	}
	return out, nil
}

// Scrape GETs http://addr/metrics from the control-plane namespace (where Prometheus
// would run: off the nodes) and returns the body.
func (c *Cluster) Scrape(ctx context.Context, addr string) (string, error) {
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: cluster.NSDialer(c.CPNS), DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return "", err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET http://%s/metrics: %s", addr, resp.Status)
	}
	return string(body), nil
}
