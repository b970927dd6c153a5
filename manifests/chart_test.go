package manifests

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

const chartDir = "../charts/nftproxy"

// tool returns bin/<name> (built by e2e/hack/install-tools.sh, `make deps`); the
// chart's tests need it, so a missing tool fails rather than skips.
func tool(t *testing.T, name, env string) string {
	t.Helper()
	if p := os.Getenv(env); p != "" {
		return p
	}
	p, err := filepath.Abs(filepath.Join(repoRoot, "bin", name))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s not found (%v): run e2e/hack/install-tools.sh or make deps", p, err)
	}
	return p
}

// helmTemplate renders the chart with args and returns its output, or the error and
// helm's stderr.
func helmTemplate(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(tool(t, "helm", "HELM"), append([]string{"template", "nftproxy", chartDir, "--namespace", "kube-system"}, args...)...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return stderr.String(), err
	}
	return string(out), nil
}

// required are values every rendering below needs.
var required = []string{"--set", "apiServer.host=192.0.2.1", "--set", "apiServer.port=6443"}

// docs decodes rendered YAML into its objects, by "Kind/name".
func docs(t *testing.T, y string) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	r := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(y)))
	for {
		doc, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := yaml.Unmarshal(doc, &m); err != nil {
			t.Fatalf("%v\n%s", err, doc)
		}
		if m == nil {
			continue
		}
		key := str(m, "kind") + "/" + str(m, "metadata", "name")
		if _, dup := out[key]; dup {
			t.Errorf("%s rendered twice", key)
		}
		out[key] = m
	}
	return out
}

// get walks m along path (map keys; an int indexes a list); nil if absent.
func get(m any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			mm, ok := m.(map[string]any)
			if !ok {
				return nil
			}
			m = mm[k]
		case int:
			l, ok := m.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			m = l[k]
		}
	}
	return m
}

func str(m any, path ...any) string {
	s, _ := get(m, path...).(string)
	return s
}

func stringMap(m any, path ...any) map[string]string {
	out := map[string]string{}
	mm, _ := get(m, path...).(map[string]any)
	for k, v := range mm {
		out[k], _ = v.(string)
	}
	return out
}

func subset(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return len(sel) > 0
}

// TestManifestsMatchChart: manifests/*.yaml are exactly what manifests/generate.sh
// (`make manifests`) renders from the chart now. If this fails, run `make manifests`.
func TestManifestsMatchChart(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command("./generate.sh", dir)
	cmd.Env = append(os.Environ(), "HELM="+tool(t, "helm", "HELM"), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("generate.sh: %v\n%s", err, out)
	}
	generated, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	shipped, _ := filepath.Glob("*.yaml")
	if len(generated) != len(shipped) || len(generated) == 0 {
		t.Errorf("generate.sh writes %d files, manifests/ has %d (%q)", len(generated), len(shipped), shipped)
	}
	for _, g := range generated {
		want, _ := os.ReadFile(g)
		have, err := os.ReadFile(filepath.Base(g))
		if err != nil {
			t.Errorf("%v (run make manifests)", err)
			continue
		}
		if !bytes.Equal(have, want) {
			t.Errorf("manifests/%s differs from the chart's rendering: run `make manifests` (or change the chart, not the file)\n%s",
				filepath.Base(g), firstDiff(string(have), string(want)))
		}
	}
}

func firstDiff(have, want string) string {
	h, w := strings.Split(have, "\n"), strings.Split(want, "\n")
	for i := 0; i < len(h) || i < len(w); i++ {
		var a, b string
		if i < len(h) {
			a = h[i]
		}
		if i < len(w) {
			b = w[i]
		}
		if a != b {
			return "line " + strconv.Itoa(i+1) + ":\n  manifests/: " + a + "\n  chart:      " + b
		}
	}
	return ""
}

// TestChartRefusesBadValues: without the API server's address helm fails with a line
// naming the value to set; the schema refuses malformed values; a dev tag is refused.
func TestChartRefusesBadValues(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"no values", nil, "apiServer.host is required: the API server's address as the nodes reach it"},
		{"no port", []string{"--set", "apiServer.host=192.0.2.1"}, "apiServer.port is required"},
		{"no host", []string{"--set", "apiServer.port=6443"}, "apiServer.host is required"},
		{"port out of range", []string{"--set", "apiServer.host=192.0.2.1", "--set", "apiServer.port=70000"}, "/apiServer/port"},
		{"URL as host", []string{"--set", "apiServer.host=https://192.0.2.1", "--set", "apiServer.port=6443"}, "/apiServer/host"},
		{"unknown value", append([]string{"--set", "metrics.bindAdress=0.0.0.0:10249"}, required...), "bindAdress"},
		{"dev image", append([]string{"--set", "image.tag=dev"}, required...), "image.tag dev is a local build's tag, not a release"},
		{"service on loopback", append([]string{"--set", "metrics.bindAddress=127.0.0.1:10249"}, required...), "metrics.service.enabled needs metrics.bindAddress"},
		{"ServiceMonitor without Service", append([]string{"--set", "serviceMonitor.enabled=true", "--set", "metrics.service.enabled=false"}, required...), "serviceMonitor.enabled needs metrics.service.enabled"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, err := helmTemplate(t, c.args...)
			if err == nil {
				t.Fatalf("helm template %q succeeded, want a failure mentioning %q", c.args, c.want)
			}
			if !strings.Contains(out, c.want) {
				t.Errorf("helm template %q: %q does not mention %q", c.args, out, c.want)
			}
		})
	}
}

// TestChartDefaults: the defaults name the chart's release image, never :dev, and
// expose metrics for Prometheus through the metrics Service.
func TestChartDefaults(t *testing.T) {
	y, err := helmTemplate(t, required...)
	if err != nil {
		t.Fatalf("%v: %s", err, y)
	}
	objs := docs(t, y)
	chart := map[string]any{}
	b, _ := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err := yaml.Unmarshal(b, &chart); err != nil {
		t.Fatal(err)
	}
	if chart["version"] != "0.1.0" || chart["appVersion"] != "v0.1.0" {
		t.Errorf("Chart.yaml version %v appVersion %v", chart["version"], chart["appVersion"])
	}
	// The release's version, where the repository keeps it in a file, is the image tag
	// the chart installs by default.
	if v, err := os.ReadFile(filepath.Join(repoRoot, "VERSION")); err == nil && strings.TrimSpace(string(v)) != chart["appVersion"] {
		t.Errorf("VERSION is %q, Chart.yaml's appVersion %v: the chart would install another release's image", strings.TrimSpace(string(v)), chart["appVersion"])
	}
	ds := objs["DaemonSet/nftproxy"]
	if ds == nil {
		t.Fatalf("no DaemonSet/nftproxy in %q", keys(objs))
	}
	image := str(ds, "spec", "template", "spec", "containers", 0, "image")
	if image != "ghcr.io/nftproxy/nftproxy:"+chart["appVersion"].(string) {
		t.Errorf("default image %q, want ghcr.io/nftproxy/nftproxy:<appVersion>", image)
	}
	cm := objs["ConfigMap/nftproxy"]
	if !strings.Contains(str(cm, "data", "kubeconfig.conf"), "server: https://192.0.2.1:6443\n") {
		t.Errorf("kubeconfig without the API server's address:\n%s", str(cm, "data", "kubeconfig.conf"))
	}
	if !strings.Contains(str(cm, "data", "config.conf"), "metricsBindAddress: 0.0.0.0:10249\n") {
		t.Errorf("default metrics bind address not 0.0.0.0:10249:\n%s", str(cm, "data", "config.conf"))
	}
	svc := objs["Service/nftproxy-metrics"]
	if svc == nil {
		t.Fatalf("no metrics Service by default: %q", keys(objs))
	}
	if !subset(stringMap(svc, "spec", "selector"), stringMap(ds, "spec", "template", "metadata", "labels")) {
		t.Errorf("metrics Service selector %v does not select the pods (%v)", stringMap(svc, "spec", "selector"), stringMap(ds, "spec", "template", "metadata", "labels"))
	}
	if get(svc, "spec", "ports", 0, "port") != float64(10249) || str(svc, "spec", "ports", 0, "targetPort") != "metrics" ||
		get(ds, "spec", "template", "spec", "containers", 0, "ports", 0, "containerPort") != float64(10249) {
		t.Errorf("metrics Service port %v -> %v, container port %v; want 10249 -> metrics (10249)", get(svc, "spec", "ports", 0, "port"),
			get(svc, "spec", "ports", 0, "targetPort"), get(ds, "spec", "template", "spec", "containers", 0, "ports", 0, "containerPort"))
	}
	if stringMap(ds, "spec", "template", "metadata", "labels")["k8s-app"] != "nftproxy" {
		t.Errorf("pods' k8s-app label %q, want nftproxy", stringMap(ds, "spec", "template", "metadata", "labels")["k8s-app"])
	}
	for _, k := range []string{"ServiceMonitor/nftproxy", "PodMonitor/nftproxy", "PrometheusRule/nftproxy", "ConfigMap/nftproxy-dashboards"} {
		if objs[k] != nil {
			t.Errorf("%s rendered by default (needs the Prometheus Operator / Grafana; off unless asked)", k)
		}
	}

	// An IPv6 API server address is bracketed in the URL.
	y, err = helmTemplate(t, "--set", "apiServer.host=fd00::1", "--set", "apiServer.port=443")
	if err != nil {
		t.Fatalf("%v: %s", err, y)
	}
	if !strings.Contains(y, "server: https://[fd00::1]:443\n") {
		t.Error("IPv6 API server address not bracketed in the kubeconfig")
	}
}

func keys(m map[string]map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestChartMonitoring: with everything on, each monitoring object finds what it
// scrapes, the PrometheusRule is the rules file with its job, and the dashboard is the
// JSON file in a ConfigMap for Grafana's sidecar.
func TestChartMonitoring(t *testing.T) {
	y, err := helmTemplate(t, append([]string{"--set", "serviceMonitor.enabled=true", "--set", "podMonitor.enabled=true",
		"--set", "prometheusRule.enabled=true", "--set", "prometheusRule.job=kube-proxy", "--set", "dashboards.enabled=true",
		"--set", "kubeProxyLabel=true", "--set", "podLabels.team=net"}, required...)...)
	if err != nil {
		t.Fatalf("%v: %s", err, y)
	}
	objs := docs(t, y)
	ds, svc := objs["DaemonSet/nftproxy"], objs["Service/nftproxy-metrics"]
	podLabels := stringMap(ds, "spec", "template", "metadata", "labels")
	if podLabels["k8s-app"] != "kube-proxy" || podLabels["team"] != "net" {
		t.Errorf("kubeProxyLabel=true, podLabels.team=net: pod labels %v", podLabels)
	}
	if sel := stringMap(ds, "spec", "selector", "matchLabels"); sel["k8s-app"] != "" || !subset(sel, podLabels) {
		t.Errorf("DaemonSet selector %v: must select the pods and not depend on k8s-app (immutable, and kubeProxyLabel changes it)", sel)
	}

	sm := objs["ServiceMonitor/nftproxy"]
	if !subset(stringMap(sm, "spec", "selector", "matchLabels"), stringMap(svc, "metadata", "labels")) {
		t.Errorf("ServiceMonitor selector %v does not select the metrics Service (labels %v)", stringMap(sm, "spec", "selector", "matchLabels"), stringMap(svc, "metadata", "labels"))
	}
	if str(sm, "spec", "endpoints", 0, "port") != str(svc, "spec", "ports", 0, "name") || str(sm, "spec", "endpoints", 0, "path") != "/metrics" {
		t.Errorf("ServiceMonitor endpoint %v, Service port %q", get(sm, "spec", "endpoints", 0), str(svc, "spec", "ports", 0, "name"))
	}
	if jl := str(sm, "spec", "jobLabel"); stringMap(svc, "metadata", "labels")[jl] != "nftproxy" {
		t.Errorf("ServiceMonitor jobLabel %q: the Service's value is %q, the rules' job is nftproxy", jl, stringMap(svc, "metadata", "labels")[jl])
	}
	pm := objs["PodMonitor/nftproxy"]
	if !subset(stringMap(pm, "spec", "selector", "matchLabels"), podLabels) ||
		str(pm, "spec", "podMetricsEndpoints", 0, "port") != str(ds, "spec", "template", "spec", "containers", 0, "ports", 0, "name") {
		t.Errorf("PodMonitor %v does not select the pods' metrics port", get(pm, "spec"))
	}

	// The PrometheusRule's groups are the rules file's, job="nftproxy" replaced.
	rules, err := os.ReadFile(filepath.Join(chartDir, "files", "nftproxy.rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var want map[string]any
	if err := yaml.Unmarshal([]byte(strings.ReplaceAll(string(rules), `job="nftproxy"`, `job="kube-proxy"`)), &want); err != nil {
		t.Fatal(err)
	}
	pr := objs["PrometheusRule/nftproxy"]
	gotJSON, _ := json.Marshal(get(pr, "spec"))
	wantJSON, _ := json.Marshal(want)
	if !bytes.Equal(gotJSON, wantJSON) {
		t.Errorf("PrometheusRule spec is not the rules file with job=\"kube-proxy\":\n got %s\nwant %s", gotJSON, wantJSON)
	}
	if strings.Contains(string(gotJSON), `job=\"nftproxy\"`) || !strings.Contains(string(gotJSON), `job=\"kube-proxy\"`) {
		t.Error("prometheusRule.job not applied")
	}

	dash := objs["ConfigMap/nftproxy-dashboards"]
	if stringMap(dash, "metadata", "labels")["grafana_dashboard"] != "1" {
		t.Errorf("dashboards ConfigMap labels %v: Grafana's sidecar looks for grafana_dashboard: \"1\"", stringMap(dash, "metadata", "labels"))
	}
	file, _ := os.ReadFile(filepath.Join(chartDir, "files", "nftproxy-dashboard.json"))
	if got := str(dash, "data", "nftproxy.json"); got != strings.TrimRight(string(file), "\n") || !json.Valid([]byte(got)) {
		t.Errorf("dashboards ConfigMap's nftproxy.json is not files/nftproxy-dashboard.json (valid JSON: %v)", json.Valid([]byte(got)))
	}
}
