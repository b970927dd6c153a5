package manifests

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdv1 "k8s.io/client-go/tools/clientcmd/api/v1"
	"sigs.k8s.io/yaml"

	"github.com/nftproxy/nftproxy/internal/config"
)

// objects are the typed contents of manifests/*.yaml.
type objects struct {
	daemonSets      []*appsv1.DaemonSet
	configMaps      []*corev1.ConfigMap
	serviceAccounts []*corev1.ServiceAccount
	roles           []*rbacv1.ClusterRole
	bindings        []*rbacv1.ClusterRoleBinding
}

// load decodes every document of every manifest strictly (unknown or duplicate fields
// fail) into its typed Kubernetes object.
func load(t *testing.T) objects {
	t.Helper()
	files, err := filepath.Glob("*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	var out objects
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
		for i := 0; ; i++ {
			doc, err := r.Read()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal(doc, &tm); err != nil {
				t.Fatalf("%s doc %d: %v", f, i, err)
			}
			if tm.Kind == "" {
				if len(bytes.TrimSpace(stripComments(doc))) != 0 {
					t.Errorf("%s doc %d has no kind", f, i)
				}
				continue
			}
			var obj any
			switch tm.APIVersion + " " + tm.Kind {
			case "apps/v1 DaemonSet":
				o := &appsv1.DaemonSet{}
				out.daemonSets, obj = append(out.daemonSets, o), o
			case "v1 ConfigMap":
				o := &corev1.ConfigMap{}
				out.configMaps, obj = append(out.configMaps, o), o
			case "v1 ServiceAccount":
				o := &corev1.ServiceAccount{}
				out.serviceAccounts, obj = append(out.serviceAccounts, o), o
			case "rbac.authorization.k8s.io/v1 ClusterRole":
				o := &rbacv1.ClusterRole{}
				out.roles, obj = append(out.roles, o), o
			case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
				o := &rbacv1.ClusterRoleBinding{}
				out.bindings, obj = append(out.bindings, o), o
			default:
				t.Errorf("%s doc %d: unexpected %s %s", f, i, tm.APIVersion, tm.Kind)
				continue
			}
			if err := yaml.UnmarshalStrict(doc, obj); err != nil {
				t.Errorf("%s doc %d (%s): %v", f, i, tm.Kind, err)
			}
		}
	}
	return out
}

func stripComments(doc []byte) []byte {
	var out [][]byte
	for _, l := range bytes.Split(doc, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(l), []byte("#")) {
			out = append(out, l)
		}
	}
	return bytes.Join(out, []byte("\n"))
}

func one[T any](t *testing.T, what string, xs []*T) *T {
	t.Helper()
	if len(xs) != 1 {
		t.Fatalf("want exactly one %s, have %d", what, len(xs))
	}
	return xs[0]
}

func TestManifests(t *testing.T) {
	objs := load(t)
	ds := one(t, "DaemonSet", objs.daemonSets)
	cm := one(t, "ConfigMap", objs.configMaps)
	sa := one(t, "ServiceAccount", objs.serviceAccounts)
	role := one(t, "ClusterRole", objs.roles)
	binding := one(t, "ClusterRoleBinding", objs.bindings)

	for what, ns := range map[string]string{"DaemonSet": ds.Namespace, "ConfigMap": cm.Namespace, "ServiceAccount": sa.Namespace} {
		if ns != "kube-system" {
			t.Errorf("%s namespace %q, want kube-system", what, ns)
		}
	}

	// The DaemonSet runs on every Linux node's host network, critical, like kube-proxy.
	spec := ds.Spec.Template.Spec
	if !spec.HostNetwork {
		t.Error("DaemonSet: hostNetwork must be true")
	}
	if spec.PriorityClassName != "system-node-critical" {
		t.Errorf("DaemonSet: priorityClassName %q", spec.PriorityClassName)
	}
	if spec.ServiceAccountName != sa.Name {
		t.Errorf("DaemonSet: serviceAccountName %q, ServiceAccount is %q", spec.ServiceAccountName, sa.Name)
	}
	if !slices.ContainsFunc(spec.Tolerations, func(tl corev1.Toleration) bool {
		return tl.Key == "" && tl.Operator == corev1.TolerationOpExists && tl.Effect == ""
	}) {
		t.Errorf("DaemonSet: needs a toleration of every taint (operator Exists, no key), has %+v", spec.Tolerations)
	}
	if spec.NodeSelector["kubernetes.io/os"] != "linux" {
		t.Errorf("DaemonSet: nodeSelector %v", spec.NodeSelector)
	}
	sel := ds.Spec.Selector.MatchLabels
	if len(sel) == 0 {
		t.Error("DaemonSet: empty selector")
	}
	for k, v := range sel {
		if ds.Spec.Template.Labels[k] != v {
			t.Errorf("DaemonSet: selector %s=%s does not match the template's labels", k, v)
		}
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("DaemonSet: %d containers", len(spec.Containers))
	}
	c := spec.Containers[0]
	if c.Image == "" {
		t.Error("DaemonSet: no image")
	}

	// Only CAP_NET_ADMIN, as root, not privileged.
	sc := c.SecurityContext
	if sc == nil || sc.Capabilities == nil {
		t.Fatal("DaemonSet: no securityContext with capabilities")
	}
	if sc.Privileged != nil && *sc.Privileged {
		t.Error("DaemonSet: privileged")
	}
	if !slices.Equal(sc.Capabilities.Add, []corev1.Capability{"NET_ADMIN"}) {
		t.Errorf("DaemonSet: capabilities.add %v, want only NET_ADMIN", sc.Capabilities.Add)
	}
	if !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Errorf("DaemonSet: capabilities.drop %v lacks ALL", sc.Capabilities.Drop)
	}
	if sc.RunAsUser == nil || *sc.RunAsUser != 0 {
		t.Errorf("DaemonSet: runAsUser must be 0 (capabilities of a non-root user are not effective), got %v", sc.RunAsUser)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("DaemonSet: allowPrivilegeEscalation must be false")
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("DaemonSet: readOnlyRootFilesystem must be true")
	}
	if spec.HostPID || spec.HostIPC {
		t.Error("DaemonSet: hostPID/hostIPC not needed")
	}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			t.Errorf("DaemonSet: hostPath volume %s not needed", v.Name)
		}
	}

	// --config names the ConfigMap's file where it is mounted, and that file loads.
	var configPath string
	for _, a := range c.Args {
		if p, ok := strings.CutPrefix(a, "--config="); ok {
			configPath = p
		}
	}
	if configPath == "" {
		t.Fatalf("DaemonSet: no --config=<file> in args %q", c.Args)
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		key, ok := strings.CutPrefix(configPath, m.MountPath+"/")
		if !ok {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil && v.ConfigMap.Name == cm.Name {
				if _, ok := cm.Data[key]; !ok {
					t.Errorf("DaemonSet: --config=%s but ConfigMap %s has no key %q", configPath, cm.Name, key)
				}
				mounted = true
			}
		}
	}
	if !mounted {
		t.Fatalf("DaemonSet: --config=%s is not in a volume of ConfigMap %s", configPath, cm.Name)
	}
	f, err := config.Parse([]byte(cm.Data[filepath.Base(configPath)]))
	if err != nil {
		t.Fatalf("ConfigMap %s: the config file does not load: %v", cm.Name, err)
	}
	if len(f.Notes) != 0 {
		t.Errorf("ConfigMap: our own config file has settings without effect: %q", f.Notes)
	}
	if _, err := config.ParseClusterCIDRs(f.Values.ClusterCIDR); err != nil || f.Values.ClusterCIDR == "" {
		t.Errorf("ConfigMap: clusterCIDR %q", f.Values.ClusterCIDR)
	}
	if f.Values.ClusterCIDR != harnessPodNetwork {
		t.Errorf("ConfigMap: clusterCIDR %q; the real-cluster e2e's pod network is %s", f.Values.ClusterCIDR, harnessPodNetwork)
	}
	checkKubeconfig(t, ds, cm, f.Values.Kubeconfig)
	if !strings.HasPrefix(f.Values.MetricsBindAddress, "127.0.0.1:") {
		t.Errorf("ConfigMap: metrics should stay on loopback, got %q", f.Values.MetricsBindAddress)
	}

	// The probes ask the health server where the config puts it.
	healthPort := f.Values.HealthzBindAddress[strings.LastIndex(f.Values.HealthzBindAddress, ":")+1:]
	for name, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("DaemonSet: no HTTP %s probe", name)
			continue
		}
		if strconv.Itoa(p.HTTPGet.Port.IntValue()) != healthPort {
			t.Errorf("DaemonSet: %s probe port %s, health server on %s", name, p.HTTPGet.Port.String(), f.Values.HealthzBindAddress)
		}
	}
	if c.LivenessProbe != nil && c.LivenessProbe.HTTPGet != nil && c.LivenessProbe.HTTPGet.Path != "/livez" {
		t.Errorf("DaemonSet: liveness probe path %q, want /livez", c.LivenessProbe.HTTPGet.Path)
	}
	if c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet != nil && c.ReadinessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("DaemonSet: readiness probe path %q, want /healthz", c.ReadinessProbe.HTTPGet.Path)
	}

	// Least privilege: exactly these grants.
	want := []string{
		"/events create",
		"/events patch",
		"/nodes get", "/nodes list", "/nodes watch",
		"/services get", "/services list", "/services watch",
		"discovery.k8s.io/endpointslices get", "discovery.k8s.io/endpointslices list", "discovery.k8s.io/endpointslices watch",
		"events.k8s.io/events create", "events.k8s.io/events patch",
		"networking.k8s.io/servicecidrs get", "networking.k8s.io/servicecidrs list", "networking.k8s.io/servicecidrs watch",
	}
	var got []string
	for _, r := range role.Rules {
		if len(r.ResourceNames) > 0 || len(r.NonResourceURLs) > 0 {
			t.Errorf("ClusterRole: unexpected rule %+v", r)
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					got = append(got, g+"/"+res+" "+v)
				}
			}
		}
	}
	sort.Strings(got)
	if !slices.Equal(got, want) {
		t.Errorf("ClusterRole grants:\n got %q\nwant %q", got, want)
	}

	if binding.RoleRef.Kind != "ClusterRole" || binding.RoleRef.Name != role.Name || binding.RoleRef.APIGroup != rbacv1.GroupName {
		t.Errorf("ClusterRoleBinding: roleRef %+v", binding.RoleRef)
	}
	if len(binding.Subjects) != 1 || binding.Subjects[0].Kind != "ServiceAccount" ||
		binding.Subjects[0].Name != sa.Name || binding.Subjects[0].Namespace != sa.Namespace {
		t.Errorf("ClusterRoleBinding: subjects %+v", binding.Subjects)
	}
}

// What the real-cluster e2e substitutes when it applies the manifests (contract B): the
// API server placeholder and the image; it relies on the pod network below.
const (
	serverPlaceholder = "https://CONTROL_PLANE_ENDPOINT:6443"
	imagePlaceholder  = "ghcr.io/nftproxy/nftproxy:v0.1.0" // the chart's image.repository:appVersion
	harnessPodNetwork = "10.244.0.0/16"
	saDir             = "/var/run/secrets/kubernetes.io/serviceaccount"
)

// mountedKey returns the ConfigMap key that path names in the DaemonSet's container,
// or "" when path is not in a volume of that ConfigMap.
func mountedKey(ds *appsv1.DaemonSet, cm *corev1.ConfigMap, path string) string {
	spec := ds.Spec.Template.Spec
	for _, m := range spec.Containers[0].VolumeMounts {
		key, ok := strings.CutPrefix(path, m.MountPath+"/")
		if !ok {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil && v.ConfigMap.Name == cm.Name {
				return key
			}
		}
	}
	return ""
}

// checkKubeconfig: the config file's clientConnection.kubeconfig is a kubeconfig in the
// same ConfigMap that reaches the API at the placeholder address (not through the
// kubernetes Service, which needs a service proxy) with the pod's service-account
// credentials, as kubeadm's kube-proxy ConfigMap does.
func checkKubeconfig(t *testing.T, ds *appsv1.DaemonSet, cm *corev1.ConfigMap, path string) {
	t.Helper()
	if path == "" {
		t.Error("ConfigMap: the config file sets no clientConnection.kubeconfig; the API would be reached through the kubernetes Service's ClusterIP")
		return
	}
	key := mountedKey(ds, cm, path)
	if key == "" {
		t.Errorf("ConfigMap: clientConnection.kubeconfig %s is not in a volume of ConfigMap %s", path, cm.Name)
		return
	}
	text, ok := cm.Data[key]
	if !ok {
		t.Errorf("ConfigMap: clientConnection.kubeconfig %s but ConfigMap %s has no key %q", path, cm.Name, key)
		return
	}
	var strict clientcmdv1.Config
	if err := yaml.UnmarshalStrict([]byte(text), &strict); err != nil {
		t.Errorf("ConfigMap: kubeconfig %s: %v", key, err)
	}
	kc, err := clientcmd.Load([]byte(text))
	if err != nil {
		t.Fatalf("ConfigMap: kubeconfig %s does not load: %v", key, err)
	}
	ctx := kc.Contexts[kc.CurrentContext]
	if ctx == nil {
		t.Fatalf("ConfigMap: kubeconfig %s: no current context %q", key, kc.CurrentContext)
	}
	cluster, user := kc.Clusters[ctx.Cluster], kc.AuthInfos[ctx.AuthInfo]
	if cluster == nil || user == nil {
		t.Fatalf("ConfigMap: kubeconfig %s: context %q names a missing cluster or user", key, kc.CurrentContext)
	}
	if cluster.Server != serverPlaceholder {
		t.Errorf("ConfigMap: kubeconfig server %q, want the placeholder %s", cluster.Server, serverPlaceholder)
	}
	if cluster.CertificateAuthority != saDir+"/ca.crt" || len(cluster.CertificateAuthorityData) != 0 || cluster.InsecureSkipTLSVerify {
		t.Errorf("ConfigMap: kubeconfig must verify the API with %s/ca.crt, has %q (insecure %v)", saDir, cluster.CertificateAuthority, cluster.InsecureSkipTLSVerify)
	}
	if user.TokenFile != saDir+"/token" || user.Token != "" || user.ClientCertificate != "" || len(user.ClientCertificateData) != 0 {
		t.Errorf("ConfigMap: kubeconfig user must be the pod's token file %s/token and nothing else, has tokenFile %q", saDir, user.TokenFile)
	}
	if a := ds.Spec.Template.Spec.AutomountServiceAccountToken; a != nil && !*a {
		t.Error("DaemonSet: automountServiceAccountToken false, but the kubeconfig uses the mounted token")
	}
	for _, m := range ds.Spec.Template.Spec.Containers[0].VolumeMounts {
		if strings.HasPrefix(saDir+"/", m.MountPath+"/") || strings.HasPrefix(m.MountPath+"/", saDir+"/") {
			t.Errorf("DaemonSet: volume %s at %s hides the service-account mount", m.Name, m.MountPath)
		}
	}

	// As the harness applies it: the placeholder replaced, the credentials present.
	dir := t.TempDir()
	for _, f := range []string{"ca.crt", "token"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	real := strings.ReplaceAll(strings.ReplaceAll(text, serverPlaceholder, "https://192.0.2.10:6443"), saDir, dir)
	kc, err = clientcmd.Load([]byte(real))
	if err != nil {
		t.Fatal(err)
	}
	rc, err := clientcmd.NewDefaultClientConfig(*kc, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		t.Fatalf("ConfigMap: kubeconfig with the address filled in: %v", err)
	}
	if rc.Host != "https://192.0.2.10:6443" || rc.BearerTokenFile != filepath.Join(dir, "token") || rc.CAFile != filepath.Join(dir, "ca.crt") {
		t.Errorf("ConfigMap: kubeconfig gives host %q, token file %q, CA %q", rc.Host, rc.BearerTokenFile, rc.CAFile)
	}
}

// Contract B: the harness applies the files as shipped with two substitutions only, so
// the placeholder address is written exactly once, and the image exactly once.
func TestSubstitutionPoints(t *testing.T) {
	files, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	server, image := 0, 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		server += bytes.Count(data, []byte(serverPlaceholder))
		image += bytes.Count(data, []byte("image: "+imagePlaceholder+"\n"))
		if n := bytes.Count(data, []byte("CONTROL_PLANE_ENDPOINT")); n != bytes.Count(data, []byte(serverPlaceholder)) {
			t.Errorf("%s: CONTROL_PLANE_ENDPOINT appears outside the full placeholder %s", f, serverPlaceholder)
		}
	}
	if server != 1 {
		t.Errorf("the placeholder %s appears %d times in manifests/*.yaml, want 1", serverPlaceholder, server)
	}
	if image != 1 {
		t.Errorf("image: %s appears %d times, want 1", imagePlaceholder, image)
	}
}

// The loader really checks: a manifest with an unknown field fails to decode.
func TestStrictDecodingCatchesUnknownFields(t *testing.T) {
	doc := []byte("apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: x}\nspec:\n  template:\n    spec:\n      hostNetwrok: true\n")
	if err := yaml.UnmarshalStrict(doc, &appsv1.DaemonSet{}); err == nil {
		t.Fatal("misspelt field accepted")
	}
}
