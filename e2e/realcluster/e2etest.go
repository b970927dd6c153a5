package realcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/e2e/cluster"
)

// SpecResult is one e2e.test spec's outcome.
type SpecResult struct {
	Name    string  `json:"name"`
	State   string  `json:"state"` // passed, failed, skipped, ...
	Seconds float64 `json:"seconds"`
	Failure string  `json:"failure,omitempty"`
}

// RunE2E runs upstream's e2e.test from the control-plane namespace against the cluster
// (--provider=skeleton, the admin kubeconfig, kubectl v1.37.0) with the ginkgo focus and
// skip regexps, writing its output to reportDir/e2e.log, and returns every spec that ran
// or skipped itself at run time (not those focus and skip left out), from ginkgo's JSON
// report.
func (c *Cluster) RunE2E(ctx context.Context, bin, reportDir, focus, skip string, timeout time.Duration) ([]SpecResult, error) {
	if err := os.MkdirAll(reportDir, 0o755); err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(reportDir, "e2e.log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	report := filepath.Join(reportDir, "report.json")
	args := []string{bin,
		"--provider=skeleton",
		"--kubeconfig=" + c.Kubeconfig,
		"--kubectl-path=" + c.Bins.Kubectl,
		"--num-nodes=" + fmt.Sprint(len(c.Nodes)),
		"--report-dir=" + reportDir,
		"--ginkgo.json-report=" + report,
		"--ginkgo.focus=" + focus,
		"--ginkgo.no-color",
		"--ginkgo.v",
		"--ginkgo.timeout=" + timeout.String(), // then ginkgo stops and still writes its report
	}
	if skip != "" {
		args = append(args, "--ginkgo.skip="+skip)
	}
	argv := cluster.InNetns(c.CPNS, args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = reportDir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.WaitDelay = 5 * time.Second
	t0 := time.Now()
	runErr := cmd.Run()
	c.h.Logf("e2e.test (focus %q) exited after %v: %v; log %s", focus, time.Since(t0).Round(time.Second), runErr, logf.Name())
	res, err := readGinkgoReport(report)
	if err != nil {
		return nil, fmt.Errorf("e2e.test: %v; report: %w; log tail:\n%s", runErr, err, tailFile(logf.Name(), 30))
	}
	return res, nil
}

func readGinkgoReport(path string) ([]SpecResult, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var reports []struct {
		SpecReports []struct {
			ContainerHierarchyTexts []string
			LeafNodeText            string
			LeafNodeType            string
			State                   string
			RunTime                 time.Duration
			Failure                 struct {
				Message string
			}
		}
	}
	if err := json.Unmarshal(b, &reports); err != nil {
		return nil, err
	}
	var out []SpecResult
	for _, r := range reports {
		for _, s := range r.SpecReports {
			// Specs left out by focus/skip are "skipped" with no message; a spec that
			// skipped itself at run time (e2eskipper: e.g. no zones) says why.
			if s.LeafNodeType != "It" || s.State == "pending" || s.State == "skipped" && s.Failure.Message == "" {
				continue
			}
			out = append(out, SpecResult{
				Name:    strings.Join(append(append([]string(nil), s.ContainerHierarchyTexts...), s.LeafNodeText), " "),
				State:   s.State,
				Seconds: s.RunTime.Seconds(),
				Failure: s.Failure.Message,
			})
		}
	}
	return out, nil
}

func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	return lastLines(string(b), n)
}

// Verify runs `nftproxy verify --wait 30s` (bin: the same build as the image) in node n's
// netns with the settings of the installed ConfigMap kube-system/nftproxy (from the chart
// or manifests/) and the admin kubeconfig.
func (c *Cluster) Verify(ctx context.Context, n *Node, bin string) (string, error) {
	cm, err := c.Client.CoreV1().ConfigMaps("kube-system").Get(ctx, "nftproxy", metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("the installed nftproxy ConfigMap: %w", err)
	}
	conf := cm.Data["config.conf"]
	if conf == "" {
		return "", fmt.Errorf("ConfigMap kube-system/nftproxy has no config.conf")
	}
	path := filepath.Join(c.WorkDir, "nftproxy-config.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		return "", err
	}
	return run(ctx, cluster.InNetns(n.NS, bin, "verify", "--config="+path, "--kubeconfig="+c.Kubeconfig,
		"--hostname-override="+n.Name, "--wait=30s")...)
}
