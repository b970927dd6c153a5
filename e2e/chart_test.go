package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/nftproxy/nftproxy/e2e/cluster"
)

// TestChartInstall: `helm install` of charts/nftproxy against a real kube-apiserver
// (helm from bin/, e2e/hack/install-tools.sh) creates what the chart renders, the API
// server accepting every object; the metrics Service selects the DaemonSet's pods and
// the ConfigMap carries the API address given; `helm uninstall` removes it all. No
// kubelet runs here: the pods themselves are the real-cluster e2e's (TestRealClusterSmoke).
func TestChartInstall(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(filepath.Join(root, "e2e", "hack", "install-tools.sh")).CombinedOutput(); err != nil {
		t.Fatalf("install-tools.sh: %v\n%s", err, out)
	}
	c := cluster.StartT(t, cluster.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	home := t.TempDir()
	helm := func(args ...string) string {
		t.Helper()
		argv := cluster.InNetns(c.NodeNS, append([]string{"env", "HELM_CACHE_HOME=" + home + "/cache", "HELM_CONFIG_HOME=" + home + "/config",
			"HELM_DATA_HOME=" + home + "/data", filepath.Join(root, "bin", "helm"), "--kubeconfig=" + c.Kubeconfig}, args...)...)
		out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
		if err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	t.Logf("%s", helm("install", "nftproxy", filepath.Join(root, "charts", "nftproxy"), "--namespace=kube-system",
		"--set=apiServer.host="+c.NodeIP.String(), "--set=apiServer.port=6443"))

	ds, err := c.Client.AppsV1().DaemonSets("kube-system").Get(ctx, "nftproxy", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm, err := c.Client.CoreV1().ConfigMaps("kube-system").Get(ctx, "nftproxy", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := "server: https://" + c.NodeIP.String() + ":6443\n"; !strings.Contains(cm.Data["kubeconfig.conf"], want) {
		t.Errorf("ConfigMap's kubeconfig lacks %q:\n%s", want, cm.Data["kubeconfig.conf"])
	}
	svc, err := c.Client.CoreV1().Services("kube-system").Get(ctx, "nftproxy-metrics", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sel := labels.SelectorFromSet(svc.Spec.Selector); svc.Spec.ClusterIP != "None" || len(svc.Spec.Selector) == 0 || !sel.Matches(labels.Set(ds.Spec.Template.Labels)) {
		t.Errorf("metrics Service (clusterIP %q, selector %v) does not select the DaemonSet's pods %v", svc.Spec.ClusterIP, svc.Spec.Selector, ds.Spec.Template.Labels)
	}
	for _, get := range []func() error{
		func() error {
			_, err := c.Client.CoreV1().ServiceAccounts("kube-system").Get(ctx, "nftproxy", metav1.GetOptions{})
			return err
		},
		func() error {
			_, err := c.Client.RbacV1().ClusterRoles().Get(ctx, "nftproxy", metav1.GetOptions{})
			return err
		},
		func() error {
			_, err := c.Client.RbacV1().ClusterRoleBindings().Get(ctx, "nftproxy", metav1.GetOptions{})
			return err
		},
	} {
		if err := get(); err != nil {
			t.Error(err)
		}
	}
	if img := ds.Spec.Template.Spec.Containers[0].Image; !strings.HasPrefix(img, "ghcr.io/nftproxy/nftproxy:v") {
		t.Errorf("DaemonSet image %q, want the chart's release image", img)
	}

	helm("uninstall", "nftproxy", "--namespace=kube-system", "--wait")
	if _, err := c.Client.AppsV1().DaemonSets("kube-system").Get(ctx, "nftproxy", metav1.GetOptions{}); err == nil {
		t.Error("DaemonSet still there after helm uninstall")
	}
	if _, err := c.Client.RbacV1().ClusterRoles().Get(ctx, "nftproxy", metav1.GetOptions{}); err == nil {
		t.Error("ClusterRole still there after helm uninstall")
	}
}
